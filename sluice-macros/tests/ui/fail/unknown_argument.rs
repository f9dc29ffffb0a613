#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", timeot = 30)]
async fn f() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
