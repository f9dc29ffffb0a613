//! Generated code uses absolute paths: local items named like the ones it needs do not
//! confuse it.
#![allow(dead_code, non_snake_case)]

mod sluice {}
struct Result;
struct Ok;
struct Err;
struct Duration;
struct Acquire;
struct Sluice;
struct From;
mod core {}

#[derive(Debug)]
pub struct AppError;

impl std::convert::From<::sluice::Error> for AppError {
    fn from(_: ::sluice::Error) -> Self {
        AppError
    }
}

#[::sluice::rate_limited("openai#rpm", timeout = 30, wait = 1)]
async fn call() -> std::result::Result<u8, AppError> {
    std::result::Result::Ok(1)
}

fn main() {
    let _ = call();
}
