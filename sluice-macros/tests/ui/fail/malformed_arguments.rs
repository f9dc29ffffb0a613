#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", timeout = "30")]
async fn string_timeout() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", timeout = 1.5)]
async fn float_timeout() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", timeout = 0)]
async fn zero_timeout() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", wait)]
async fn wait_without_value() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", crate = sluice)]
async fn crate_not_a_string() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", crate = "not a path")]
async fn crate_not_a_path() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited(42)]
async fn not_a_dimension_literal() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
