#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

pub struct Tenant;

#[sluice::rate_limited("ingest#rpm#@", key = tenant)]
async fn f(tenant: Tenant) -> Result<(), AppError> {
    let _ = tenant;
    Ok(())
}

fn main() {}
