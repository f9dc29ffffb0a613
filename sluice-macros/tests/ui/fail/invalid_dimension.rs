#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai")]
async fn no_separator() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("open ai#rpm")]
async fn whitespace() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("lease#rpm")]
async fn reserved() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("a#b#c")]
async fn two_separators() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("#rpm")]
async fn empty_vendor() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
