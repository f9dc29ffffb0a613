//! Each table's key attributes, learnt from the upstream with `DescribeTable` and kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::caller::Caller;
use crate::item::KeySchema;
use crate::upstream::Upstream;

/// Key schemas by caller scope and table name (DynamoDB Local keeps one database per
/// scope, so two callers may have different tables of one name).
#[derive(Debug, Default)]
pub(crate) struct Schemas {
    known: Mutex<HashMap<(String, String), Arc<KeySchema>>>,
}

impl Schemas {
    /// `table`'s key schema, asked of the upstream the first time. `None` if the table
    /// cannot be described (it does not exist, say): the request then passes through.
    pub(crate) async fn get(
        &self,
        upstream: &Upstream,
        caller: &Caller,
        table: &str,
    ) -> Option<Arc<KeySchema>> {
        let entry = (caller.scope().to_owned(), table.to_owned());
        if let Some(schema) = self.lock().get(&entry) {
            return Some(schema.clone());
        }
        // Two requests may both miss and both ask: harmless, the answers are the same.
        let answer = upstream
            .call(caller, "DescribeTable", &json!({"TableName": table}))
            .await
            .ok()?;
        if !answer.is_success() {
            return None;
        }
        let schema = Arc::new(KeySchema::from_description(answer.json()?.get("Table")?)?);
        self.lock().insert(entry, schema.clone());
        Some(schema)
    }

    /// Forgets `table` in every scope: it is being deleted or created, and a table of the
    /// same name may come back with other keys.
    pub(crate) fn forget(&self, table: &str) {
        self.lock().retain(|(_, name), _| name != table);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<KeySchema>>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}
