#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", priority = tier)]
async fn numbered(tier: u32) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
