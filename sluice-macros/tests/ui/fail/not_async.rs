#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm", timeout = 30)]
fn not_async() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
