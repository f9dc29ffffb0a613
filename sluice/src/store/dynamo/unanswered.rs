//! Telling that an attempt of a call went unanswered.

use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Notes whether an attempt of a call went unanswered (no answer, or a server error): a
/// write it carried may have applied although the call's final answer says otherwise.
#[derive(Debug, Clone, Default)]
pub(super) struct Unanswered(Arc<std::sync::atomic::AtomicBool>);

impl Unanswered {
    pub(super) fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl aws_sdk_dynamodb::config::Intercept for Unanswered {
    fn name(&self) -> &'static str {
        "sluice::Unanswered"
    }

    fn read_after_attempt(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextRef<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let answered = context
            .response()
            .is_some_and(|r| !r.status().is_server_error());
        if !answered {
            self.0.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}
