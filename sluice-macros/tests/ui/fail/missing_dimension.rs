#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited(timeout = 30)]
async fn no_dimension() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited]
async fn no_arguments() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
