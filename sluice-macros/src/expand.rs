//! Generating the wrapped function.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    Block, Expr, GenericArgument, ItemFn, PathArguments, ReturnType, Stmt, Type, TypeParamBound,
};

use crate::attr::{Args, PriorityArg};

pub(crate) fn expand(args: Args, mut item: ItemFn) -> syn::Result<TokenStream> {
    if item.sig.asyncness.is_some() {
        let output = result_type(&item.sig.output, &item.sig)?;
        let block = &item.block;
        let wrapped = wrapper(&args, output, quote!(#block));
        *item.block = syn::parse2(quote!({ #wrapped }))?;
        return Ok(quote!(#item));
    }
    // `#[async_trait]` has already turned `async fn` into a fn returning
    // `Pin<Box<dyn Future<Output = T> + Send + '_>>` whose body is `Box::pin(async move { .. })`.
    if let Some(output) = async_trait_output(&item.sig.output) {
        check_result(&output, &item.sig)?;
        if let Some(inner) = async_trait_body(&mut item.block) {
            let block = inner.clone();
            let wrapped = wrapper(&args, &output, quote!(#block));
            *inner = syn::parse2(quote!({ #wrapped }))?;
            return Ok(quote!(#item));
        }
    }
    Err(syn::Error::new(
        item.sig.fn_token.span(),
        format!(
            "`#[rate_limited]` works on `async fn` only; make `{}` async",
            item.sig.ident
        ),
    ))
}

fn result_type<'a>(output: &'a ReturnType, sig: &syn::Signature) -> syn::Result<&'a Type> {
    match output {
        ReturnType::Type(_, ty) => {
            check_result(ty, sig)?;
            Ok(ty)
        }
        ReturnType::Default => Err(syn::Error::new(
            sig.ident.span(),
            format!(
                "`{}` must return `Result<T, E>` with `E: From<sluice::Error>`, so that a RetryIn can reach its caller",
                sig.ident
            ),
        )),
    }
}

fn check_result(ty: &Type, sig: &syn::Signature) -> syn::Result<()> {
    let is_result = match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Result")),
        _ => false,
    };
    if is_result {
        Ok(())
    } else {
        Err(syn::Error::new(
            ty.span(),
            format!(
                "`{}` must return `Result<T, E>` with `E: From<sluice::Error>`, so that a RetryIn can reach its caller",
                sig.ident
            ),
        ))
    }
}

/// `T` in `Pin<Box<dyn Future<Output = T> + ...>>`.
fn async_trait_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pin = last_generic(ty, "Pin")?;
    let boxed = last_generic(pin, "Box")?;
    let Type::TraitObject(object) = boxed else {
        return None;
    };
    object.bounds.iter().find_map(|b| {
        let TypeParamBound::Trait(t) = b else {
            return None;
        };
        let seg = t.path.segments.last()?;
        if seg.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(a) = &seg.arguments else {
            return None;
        };
        a.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(assoc.ty.clone()),
            _ => None,
        })
    })
}

fn last_generic<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(a) = &seg.arguments else {
        return None;
    };
    a.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

/// The block of the `async move { .. }` in a tail `Box::pin(async move { .. })`.
fn async_trait_body(block: &mut Block) -> Option<&mut Block> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = block.stmts.last_mut() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut()? {
        Expr::Async(a) => Some(&mut a.block),
        _ => None,
    }
}

/// The statements that replace the body: acquire (waiting if asked), run the original body
/// under the lease with its deadline, release on every path; sluice's errors become the
/// function's error type through `From`.
fn wrapper(args: &Args, output: &Type, body: TokenStream) -> TokenStream {
    // Generated names and paths carry a mixed-site span: they cannot clash with the user's
    // names, and lints about the user's code do not fire on them.
    let site = Span::mixed_site();
    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote_spanned!(site=> ::sluice),
    };
    // Spanned on the return type, so an error type without `From<sluice::Error>` is
    // reported there.
    let convert = |error: TokenStream| quote_spanned!(output.span()=> <#output as #krate::__private::FromSluiceError>::from_sluice_error(#error));
    let slot_error = convert(quote_spanned!(site=> __sluice_error));
    let global_error = convert(quote_spanned!(site=> __sluice_error));
    let client = match &args.client {
        Some(expr) => {
            // Spanned on the expression, so a client of the wrong type is reported there.
            let borrowed = quote_spanned!(expr.span()=> &(#expr));
            quote_spanned! {site=>
                let __sluice_client: &#krate::Sluice = #borrowed;
            }
        }
        None => quote_spanned! {site=>
            let __sluice_global = match #krate::Sluice::global().await {
                ::core::result::Result::Ok(client) => client,
                ::core::result::Result::Err(__sluice_error) => return #global_error,
            };
            let __sluice_client: &#krate::Sluice = &__sluice_global;
        },
    };
    // The key, made once (spanned on the expression: one that is not `Display` is reported
    // there); a key that cannot be part of a dimension is the acquire's typed error.
    let key = args.key.as_ref().map(|e| {
        let made = quote_spanned!(e.span()=> ::std::string::ToString::to_string(&(#e)));
        quote_spanned!(site=> let __sluice_key: ::std::string::String = #made;)
    });
    let mut request = quote_spanned!(site=> #krate::Acquire::default());
    for d in &args.dimensions {
        let literal = &d.name;
        let name = if d.keyed {
            quote_spanned!(site=> ::std::format!("{}{}", #literal, __sluice_key))
        } else {
            quote!(#literal)
        };
        request = match &d.cost {
            Some(cost) => quote_spanned!(site=> #request.and_cost(#name, #cost)),
            None => quote_spanned!(site=> #request.and(#name)),
        };
    }
    match &args.priority {
        Some(PriorityArg::Name(name)) => {
            request = quote_spanned!(site=> #request.priority(#krate::__private::checked_priority(#name)));
        }
        Some(PriorityArg::Expr(e)) => {
            // Spanned on the expression, so one of the wrong type is reported there.
            let value =
                quote_spanned!(e.span()=> #krate::__private::IntoPriority::into_priority(#e));
            request = quote_spanned!(site=> #request.or_priority(#value));
        }
        None => {}
    }
    let timeout = match &args.timeout {
        Some(e) => {
            let e = duration(e, site);
            quote_spanned!(site=> ::core::option::Option::Some(#e))
        }
        None => quote_spanned!(site=> ::core::option::Option::None),
    };
    let wait = match &args.wait {
        Some(e) => duration(e, site),
        None => quote_spanned!(site=> ::core::time::Duration::ZERO),
    };
    quote_spanned! {site=>
        #client
        #key
        let __sluice_request = #request;
        let __sluice_timeout: ::core::option::Option<::core::time::Duration> = #timeout;
        let __sluice_wait: ::core::time::Duration = #wait;
        let __sluice_body = async move {
            let __sluice_result: #output = #body;
            #[allow(unreachable_code)]
            __sluice_result
        };
        match __sluice_client
            .slot_within(__sluice_request, __sluice_timeout, __sluice_wait, || __sluice_body)
            .await
        {
            ::core::result::Result::Ok(__sluice_result) => __sluice_result,
            ::core::result::Result::Err(__sluice_error) => #slot_error,
        }
    }
}

/// Whole seconds for an integer literal, the expression itself otherwise.
fn duration(e: &Expr, site: Span) -> TokenStream {
    match e {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(_),
            ..
        }) => {
            quote_spanned!(site=> ::core::time::Duration::from_secs(#e))
        }
        _ => quote!(#e),
    }
}
