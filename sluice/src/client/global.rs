//! The process-wide default client, for code that cannot carry a `Sluice` around (the
//! `#[rate_limited]` attribute, layers built without an explicit client).

use std::sync::RwLock;

use super::Sluice;
use crate::error::Error;

static GLOBAL: RwLock<Option<Sluice>> = RwLock::new(None);
static INIT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Sluice {
    /// The process-wide default client: the one set with [`Sluice::set_global`], or else
    /// one built from the environment on first use (see [`Sluice::from_env`]): with no
    /// `SLUICE_TABLE_NAME` and no explicit `SLUICE_STORE=memory`, an error naming them
    /// ([`ConfigError::NoStore`](crate::ConfigError::NoStore)), tried again on the next
    /// call.
    pub async fn global() -> Result<Sluice, Error> {
        if let Some(s) = read() {
            return Ok(s);
        }
        let _guard = INIT.lock().await;
        if let Some(s) = read() {
            return Ok(s);
        }
        let sluice = Sluice::from_env().await?;
        *GLOBAL.write().unwrap_or_else(|p| p.into_inner()) = Some(sluice.clone());
        Ok(sluice)
    }

    /// Replaces the process-wide default client; returns the previous one.
    pub fn set_global(sluice: Sluice) -> Option<Sluice> {
        GLOBAL
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .replace(sluice)
    }
}

fn read() -> Option<Sluice> {
    GLOBAL.read().unwrap_or_else(|p| p.into_inner()).clone()
}
