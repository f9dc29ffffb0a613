//! Every supported form, compiled with lints that catch sloppy generated code.
#![deny(unused_qualifications, unused_variables, unused_mut, unused_imports)]

use std::time::Duration;

#[derive(Debug)]
pub struct AppError(#[allow(dead_code)] sluice::Error);

impl From<sluice::Error> for AppError {
    fn from(e: sluice::Error) -> Self {
        AppError(e)
    }
}

#[sluice::rate_limited("openai#rpm")]
async fn plain() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("ingest#rpm#@", key = tenant)]
async fn keyed_by_an_argument(tenant: &str) -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("user#tpm#@" = tokens, "openai#tpm" = tokens, key = user_id, timeout = 30)]
async fn a_key_and_a_shared_dimension(user_id: u64, tokens: u64) -> Result<u64, AppError> {
    Ok(user_id + tokens)
}

#[sluice::rate_limited("openai#rpm", timeout = 30)]
async fn with_timeout_seconds(doc: &str) -> Result<usize, AppError> {
    Ok(doc.len())
}

#[sluice::rate_limited("openai#rpm", timeout = Duration::from_millis(1_500), wait = 5)]
async fn with_duration_timeout_and_wait() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", wait = Duration::from_secs(2))]
async fn with_duration_wait() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", "openai#tpm" = prompt.len() / 4 + max_tokens, timeout = 60)]
async fn several_dimensions_with_costs(prompt: String, max_tokens: usize) -> Result<String, AppError> {
    Ok(prompt)
}

#[sluice::rate_limited("openai#tpm" = 1_500u64)]
async fn constant_cost() -> Result<(), AppError> {
    Ok(())
}

fn my_client() -> sluice::Sluice {
    sluice::Sluice::in_memory()
}

#[sluice::rate_limited("openai#rpm", client = my_client())]
async fn with_client_expression() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = "batch")]
async fn with_priority_name() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = tier.clone(), timeout = 5)]
async fn with_priority_expression(tier: sluice::Priority) -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", priority = tier)]
async fn with_optional_priority(tier: Option<sluice::Priority>) -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm", crate = "::sluice", timeout = 5)]
async fn with_crate_path() -> Result<(), AppError> {
    Ok(())
}

#[sluice::rate_limited("openai#rpm")]
async fn generic<T: std::fmt::Display + Send>(value: T) -> Result<String, AppError> {
    Ok(value.to_string())
}

#[sluice::rate_limited("openai#rpm")]
async fn early_return_and_question_mark(fail: bool) -> Result<u8, AppError> {
    if fail {
        return Err(AppError(sluice::Error::Timeout(Duration::from_secs(1))));
    }
    let n: u8 = "7".parse().map_err(|_| AppError(sluice::Error::Timeout(Duration::ZERO)))?;
    Ok(n)
}

type AppResult<T> = Result<T, AppError>;

#[sluice::rate_limited("openai#rpm")]
async fn result_alias() -> AppResult<()> {
    Ok(())
}

pub struct Vendor {
    sluice: sluice::Sluice,
    calls: u32,
}

impl Vendor {
    #[sluice::rate_limited("openai#rpm", client = self.sluice)]
    pub async fn by_ref(&self, text: &str) -> Result<usize, AppError> {
        Ok(text.len() + self.calls as usize)
    }

    #[sluice::rate_limited("openai#rpm", client = self.sluice.clone(), timeout = 10)]
    pub async fn by_mut(&mut self) -> Result<u32, AppError> {
        self.calls += 1;
        Ok(self.calls)
    }

    #[sluice::rate_limited("elevenlabs#concurrent")]
    pub async fn associated(text: &'static str) -> Result<&'static str, AppError> {
        Ok(text)
    }
}

pub trait Transcribe {
    fn transcribe(&self, audio: &[u8]) -> impl Future<Output = Result<String, AppError>> + Send;
}

impl Transcribe for Vendor {
    #[sluice::rate_limited("openai#rpm", client = self.sluice)]
    async fn transcribe(&self, audio: &[u8]) -> Result<String, AppError> {
        Ok(format!("{} bytes", audio.len()))
    }
}

#[async_trait::async_trait]
pub trait Speak {
    async fn speak(&self, text: &str) -> Result<Vec<u8>, AppError>;
}

#[async_trait::async_trait]
impl Speak for Vendor {
    #[sluice::rate_limited("elevenlabs#concurrent", client = self.sluice, timeout = 30)]
    async fn speak(&self, text: &str) -> Result<Vec<u8>, AppError> {
        Ok(text.as_bytes().to_vec())
    }
}

fn main() {
    let _ = plain();
    let _ = with_timeout_seconds("x");
    let _ = with_duration_timeout_and_wait();
    let _ = with_duration_wait();
    let _ = several_dimensions_with_costs(String::new(), 1);
    let _ = constant_cost();
    let _ = with_client_expression();
    let _ = with_crate_path();
    let _ = generic(1);
    let _ = early_return_and_question_mark(false);
    let _ = result_alias();
    let mut v = Vendor { sluice: sluice::Sluice::in_memory(), calls: 0 };
    let _ = v.by_ref("x");
    let _ = v.by_mut();
    let _ = Vendor::associated("x");
    let _ = v.speak("x");
    let _ = v.transcribe(b"x");
}
