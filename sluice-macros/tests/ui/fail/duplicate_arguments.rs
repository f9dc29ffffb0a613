#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", timeout = 1, timeout = 2)]
async fn twice() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", wait = 1, client = sluice::Sluice::in_memory(), wait = 2)]
async fn wait_twice() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", "openai#rpm")]
async fn dimension_twice() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
