//! The conformance suite on the embedded in-memory store, plus checks that need many
//! tasks or many random cases and run fastest in memory.

use crate::conformance;

use std::sync::Arc;

use sluice::{MemoryStore, store::Store};

async fn memory_store() -> Option<Arc<dyn Store>> {
    Some(Arc::new(MemoryStore::new()))
}

conformance::suite!(memory_store);
