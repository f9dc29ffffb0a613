#[derive(Debug)]
pub struct NotFromSluice;

#[sluice::rate_limited("openai#rpm")]
async fn f() -> Result<(), NotFromSluice> {
    Ok(())
}

fn main() {}
