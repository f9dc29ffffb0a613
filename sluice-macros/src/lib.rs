//! The `#[rate_limited]` attribute of [sluice](https://docs.rs/sluice-limiter): runs an `async fn`
//! in a slot of a shared quota. Use it through `sluice::rate_limited`.

#![forbid(unsafe_code)]

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Runs an `async fn` in a slot: acquires capacity on the given dimensions, runs the
/// body, and releases on every path (return, error, panic, timeout, cancellation).
///
/// ```
/// #[derive(Debug)]
/// struct AppError(sluice::Error);
/// impl From<sluice::Error> for AppError {
///     fn from(e: sluice::Error) -> Self { AppError(e) }
/// }
///
/// #[sluice::rate_limited("openai#rpm", timeout = 30)]
/// async fn summarize(doc: &str) -> Result<String, AppError> {
///     Ok(doc.to_uppercase()) // the vendor call
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let sluice = sluice::Sluice::in_memory();
/// sluice.put_bucket("openai#rpm", sluice::Bucket::requests(sluice::RefillRate::per_minute(500))).await.unwrap();
/// sluice::Sluice::set_global(sluice);
/// assert_eq!(summarize("hi").await.unwrap(), "HI");
/// # });
/// ```
///
/// The function keeps its signature; it must be `async` and return `Result<T, E>` with
/// `E: From<sluice::Error>`, so a RetryIn (or any other sluice error) reaches the caller
/// through `E`. Arguments:
///
/// - one or more dimensions, each `"vendor#metric"` (its bucket's `cost_per_call`) or
///   `"vendor#metric" = cost` where `cost` is an expression that may use the function's
///   arguments (e.g. `"openai#tpm" = prompt.len() / 4`); all or nothing;
/// - `timeout = 30` (seconds) or `timeout = <Duration>`: the body's deadline, opt-in, also
///   the lease's TTL (default: no deadline, the client's lease TTL; a `concurrent` slot is
///   renewed for as long as the body runs);
/// - `wait = 5` (seconds) or `wait = <Duration>`: on RetryIn, wait inline for capacity up to
///   this long in total (default: do not wait);
/// - `client = <expr>`: the `Sluice` to use (default: `Sluice::global()`);
/// - `priority = "batch"` (checked at compile time) or `priority = <expr>` (a
///   `sluice::Priority`, or an `Option` of one, which may use the function's arguments):
///   the acquire's priority on buckets that keep reserves (default: the client's);
/// - `key = <expr>` (any `Display` value, e.g. a function's argument): the key of every
///   dimension named as a keyed bucket's with a trailing `#@` (`"ingest#rpm#@"` with
///   `key = tenant` acquires on `ingest#rpm#@acme` for the tenant `acme`); a key that cannot
///   be part of a dimension (one with `#` or whitespace) is the acquire's
///   `Error::InvalidDimension`, through `E`;
/// - `crate = "path"`: where the sluice crate is, when renamed or re-exported.
///
/// A tenant's budget and the vendor's, in one all-or-nothing acquire:
///
/// ```
/// # #[derive(Debug)]
/// # struct AppError(sluice::Error);
/// # impl From<sluice::Error> for AppError {
/// #     fn from(e: sluice::Error) -> Self { AppError(e) }
/// # }
/// #[sluice::rate_limited("user#tpm#@" = tokens, "openai#tpm" = tokens, key = user)]
/// async fn complete(user: &str, tokens: u64) -> Result<(), AppError> {
///     Ok(()) // the vendor call, on `user`'s budget
/// }
/// ```
#[proc_macro_attribute]
pub fn rate_limited(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let result = syn::parse::<attr::Args>(args).and_then(|args| {
        let function = syn::parse::<syn::ItemFn>(item)?;
        expand::expand(args, function)
    });
    match result {
        Ok(tokens) => tokens.into(),
        Err(error) => {
            // Keep the original function so the rest of the crate (and IDEs) still see it.
            let error = error.to_compile_error();
            quote::quote!(#error #original).into()
        }
    }
}
