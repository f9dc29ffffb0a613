#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("ingest#rpm#@", timeout = 30)]
async fn f(tenant: &str) -> Result<usize, AppError> {
    Ok(tenant.len())
}

fn main() {}
