#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", priority = "batch jobs")]
async fn spaced() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = "")]
async fn empty() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = "a-very-long-priority-name-that-goes-on-and-on-beyond-sixty-four-bytes")]
async fn too_long() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = "batch", priority = "interactive")]
async fn twice() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
