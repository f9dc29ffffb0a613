//! Parsing `#[rate_limited(...)]`'s arguments.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Lit, LitStr, Token};

mod kw {
    syn::custom_keyword!(timeout);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(client);
    syn::custom_keyword!(priority);
    syn::custom_keyword!(key);
}

const EXPECTED: &str = "expected one of `timeout`, `wait`, `client`, `priority`, `key`, `crate`, or a dimension such as `\"openai#rpm\"`";

/// One dimension and, optionally, the expression of its cost.
pub(crate) struct DimensionArg {
    pub(crate) name: LitStr,
    pub(crate) cost: Option<Expr>,
    /// A keyed bucket's dimension waiting for its key (`"ingest#rpm#@"`): the `key`
    /// argument's value completes it.
    pub(crate) keyed: bool,
}

/// Everything the attribute was given.
pub(crate) struct Args {
    pub(crate) dimensions: Vec<DimensionArg>,
    pub(crate) timeout: Option<Expr>,
    pub(crate) wait: Option<Expr>,
    pub(crate) client: Option<Expr>,
    pub(crate) priority: Option<PriorityArg>,
    pub(crate) key: Option<Expr>,
    pub(crate) krate: Option<syn::Path>,
}

/// `priority = "batch"` (checked at compile time) or `priority = <expression>` (a
/// `sluice::Priority` or an `Option` of one).
pub(crate) enum PriorityArg {
    Name(LitStr),
    Expr(Expr),
}

enum Arg {
    Dimension(DimensionArg),
    Timeout(Span, Expr),
    Wait(Span, Expr),
    Client(Span, Expr),
    Priority(Span, PriorityArg),
    Key(Span, Expr),
    Crate(Span, syn::Path),
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let lookahead = input.lookahead1();
        if lookahead.peek(LitStr) {
            let name: LitStr = input.parse()?;
            let keyed = validate_dimension(&name)?;
            let cost = if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                Some(input.parse()?)
            } else {
                None
            };
            Ok(Arg::Dimension(DimensionArg { name, cost, keyed }))
        } else if lookahead.peek(kw::timeout) {
            let k: kw::timeout = input.parse()?;
            Ok(Arg::Timeout(k.span, duration_value(input, "timeout")?))
        } else if lookahead.peek(kw::wait) {
            let k: kw::wait = input.parse()?;
            Ok(Arg::Wait(k.span, duration_value(input, "wait")?))
        } else if lookahead.peek(kw::client) {
            let k: kw::client = input.parse()?;
            input.parse::<Token![=]>()?;
            Ok(Arg::Client(k.span, input.parse()?))
        } else if lookahead.peek(kw::priority) {
            let k: kw::priority = input.parse()?;
            input.parse::<Token![=]>()?;
            let value = if input.peek(LitStr) {
                let name: LitStr = input.parse()?;
                validate_priority(&name)?;
                PriorityArg::Name(name)
            } else {
                PriorityArg::Expr(input.parse()?)
            };
            Ok(Arg::Priority(k.span, value))
        } else if lookahead.peek(kw::key) {
            let k: kw::key = input.parse()?;
            input.parse::<Token![=]>()?;
            Ok(Arg::Key(k.span, input.parse()?))
        } else if lookahead.peek(Token![crate]) {
            let k: Token![crate] = input.parse()?;
            input.parse::<Token![=]>()?;
            let path: LitStr = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "`crate` takes a string with a path, e.g. `crate = \"::sluice\"`",
                )
            })?;
            let parsed = path.parse::<syn::Path>().map_err(|_| {
                syn::Error::new(
                    path.span(),
                    format!("`{}` is not a path to the sluice crate", path.value()),
                )
            })?;
            Ok(Arg::Crate(k.span, parsed))
        } else if input.peek(syn::Ident) {
            let ident: syn::Ident = input.parse()?;
            Err(syn::Error::new(
                ident.span(),
                format!("unknown argument `{ident}`; {EXPECTED}"),
            ))
        } else {
            Err(lookahead.error())
        }
    }
}

/// `timeout`/`wait`: `= N` (whole seconds) or `= <Duration expression>`.
fn duration_value(input: ParseStream<'_>, name: &str) -> syn::Result<Expr> {
    input.parse::<Token![=]>()?;
    let value: Expr = input.parse()?;
    if let Expr::Lit(lit) = &value {
        match &lit.lit {
            Lit::Int(i) => {
                let secs: u64 = i.base10_parse()?;
                if secs == 0 && name == "timeout" {
                    return Err(syn::Error::new(
                        i.span(),
                        "`timeout` must be at least 1 second",
                    ));
                }
            }
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    format!(
                        "`{name}` takes whole seconds (`{name} = 30`) or a `Duration` expression (`{name} = Duration::from_millis(1500)`)"
                    ),
                ));
            }
        }
    }
    Ok(value)
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args {
            dimensions: Vec::new(),
            timeout: None,
            wait: None,
            client: None,
            priority: None,
            key: None,
            krate: None,
        };
        if input.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                "`#[rate_limited]` needs a dimension, e.g. `#[rate_limited(\"openai#rpm\", timeout = 30)]`",
            ));
        }
        let mut key_span = None;
        for arg in Punctuated::<Arg, Token![,]>::parse_terminated(input)? {
            match arg {
                Arg::Dimension(d) => {
                    if args
                        .dimensions
                        .iter()
                        .any(|x| x.name.value() == d.name.value())
                    {
                        return Err(syn::Error::new(
                            d.name.span(),
                            format!("dimension `{}` named twice", d.name.value()),
                        ));
                    }
                    args.dimensions.push(d);
                }
                Arg::Timeout(span, e) => set_once(&mut args.timeout, e, span, "timeout")?,
                Arg::Wait(span, e) => set_once(&mut args.wait, e, span, "wait")?,
                Arg::Client(span, e) => set_once(&mut args.client, e, span, "client")?,
                Arg::Priority(span, p) => set_once(&mut args.priority, p, span, "priority")?,
                Arg::Key(span, e) => {
                    set_once(&mut args.key, e, span, "key")?;
                    key_span = Some(span);
                }
                Arg::Crate(span, p) => set_once(&mut args.krate, p, span, "crate")?,
            }
        }
        if args.dimensions.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                "`#[rate_limited]` needs at least one dimension, e.g. `\"openai#rpm\"`",
            ));
        }
        check_key(&args, key_span)?;
        Ok(args)
    }
}

/// A keyed bucket's dimension (`"ingest#rpm#@"`) needs `key`, and `key` needs one.
fn check_key(args: &Args, key_span: Option<Span>) -> syn::Result<()> {
    let keyed = args.dimensions.iter().find(|d| d.keyed);
    match (keyed, key_span) {
        (Some(d), None) => Err(syn::Error::new(
            d.name.span(),
            format!(
                "`{}` takes its key from `key = <expression>`, e.g. `key = tenant_id`",
                d.name.value()
            ),
        )),
        (None, Some(span)) => Err(syn::Error::new(
            span,
            "`key` goes to a keyed bucket's dimension ending in `#@`, e.g. `\"ingest#rpm#@\"`; none is named",
        )),
        _ => Ok(()),
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, span: Span, name: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(span, format!("`{name}` set twice")));
    }
    *slot = Some(value);
    Ok(())
}

/// The rules of `sluice::Dimension` (the `sluice-dimension` crate), checked at compile
/// time; whether it is a keyed bucket's dimension waiting for its key (`"ingest#rpm#@"`:
/// the template's name is checked).
fn validate_dimension(lit: &LitStr) -> syn::Result<bool> {
    use sluice_dimension::Broken;
    let s = lit.value();
    let (name, keyed) = match s.strip_suffix(sluice_dimension::KEY_MARK) {
        Some(template) => (template, true),
        None => (s.as_str(), false),
    };
    let why = match sluice_dimension::check(name) {
        Ok(()) => return Ok(keyed),
        Err(Broken::Empty) => "it is empty; expected `{vendor}#{metric}`, e.g. `openai#rpm`",
        Err(Broken::TooLong) => "it is longer than 1024 bytes",
        Err(Broken::Whitespace) => "it contains whitespace",
        Err(Broken::Reserved) => "`lease#` is reserved for lease rows",
        Err(Broken::EmptyVendor | Broken::EmptyMetric) => {
            "vendor and metric must not be empty; expected `{vendor}#{metric}`"
        }
        Err(_) => "expected exactly one `#` between vendor and metric, e.g. `openai#rpm`",
    };
    Err(syn::Error::new(
        lit.span(),
        format!("invalid dimension `{s}`: {why}"),
    ))
}

/// The rules of `sluice::Priority`, checked at compile time.
fn validate_priority(lit: &LitStr) -> syn::Result<()> {
    use sluice_dimension::priority::{Broken, MAX_LEN, check};
    let s = lit.value();
    let why = match check(&s) {
        Ok(()) => return Ok(()),
        Err(Broken::Character(c)) => {
            format!("it contains `{c}`; use ASCII letters, digits, `-`, `_`, `.`")
        }
        Err(Broken::TooLong) => format!("it is longer than {MAX_LEN} bytes"),
        Err(_) => "it is empty; expected a name such as `interactive` or `batch`".to_owned(),
    };
    Err(syn::Error::new(
        lit.span(),
        format!("invalid priority `{s}`: {why}"),
    ))
}
