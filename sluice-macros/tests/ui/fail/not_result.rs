#[derive(Debug)]
pub struct AppError;
impl From<sluice::Error> for AppError {
    fn from(_: sluice::Error) -> Self {
        AppError
    }
}

#[sluice::rate_limited("openai#rpm")]
async fn returns_a_number() -> u32 {
    1
}

#[sluice::rate_limited("openai#rpm")]
async fn returns_nothing() {}

fn main() {}
