//! One row's conditional write in parts, and the macros that put them on any builder that
//! takes them: a single `UpdateItem` or `DeleteItem`, or a transaction's `Update` or
//! `Delete` (the same setters, no common type).

use std::collections::HashMap;

use super::row::{self, Item};

/// The parts of a conditional update of one row.
pub(super) struct Conditional {
    pub(super) key: Item,
    pub(super) update: String,
    pub(super) condition: String,
    pub(super) names: HashMap<String, String>,
    pub(super) values: Item,
}

impl Conditional {
    /// The update `update` of the row `key`, on a condition with its values and names (as
    /// [`Expr::into_parts`](super::row::Expr::into_parts) hands them).
    pub(super) fn new(
        key: &str,
        update: String,
        (condition, values, names): (String, Item, HashMap<String, String>),
    ) -> Self {
        Conditional {
            key: row::key(key),
            update,
            condition,
            names,
            values,
        }
    }
}

/// Puts a [`Conditional`]'s parts on `$builder`, for the table `$table`.
macro_rules! conditional {
    ($builder:expr, $table:expr, $u:expr) => {{
        let u: $crate::store::dynamo::parts::Conditional = $u;
        $builder
            .table_name($table)
            .set_key(Some(u.key))
            .update_expression(u.update)
            .condition_expression(u.condition)
            .set_expression_attribute_names(Some(u.names))
            .set_expression_attribute_values(Some(u.values))
    }};
}

/// A lease row's delete, on condition that it still exists.
macro_rules! lease_delete {
    ($builder:expr, $table:expr, $key:expr) => {
        $builder
            .table_name($table)
            .set_key(Some(row::key($key.as_str())))
            .condition_expression(EXISTS)
    };
}
