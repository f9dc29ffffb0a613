//! Which item a request names: its table and key, read through the table's key schema.

use std::fmt;

use serde_json::{Map, Value};

use crate::number::Decimal;

/// One item: a table and the text of its key (`<partition>[/<sort>]`, numbers in canonical
/// form). Ordered, so that locks on several items are always taken in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ItemId {
    table: String,
    key: String,
    /// How much of `key` is the partition key's text: DynamoDB places an item by its
    /// partition key alone.
    partition_len: usize,
}

impl ItemId {
    /// The item's table.
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// The text of the item's partition key value.
    pub(crate) fn partition_key(&self) -> &str {
        &self.key[..self.partition_len]
    }
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.table, self.key)
    }
}

/// A table's key attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySchema {
    partition: String,
    sort: Option<String>,
}

impl KeySchema {
    /// The schema of a `DescribeTable` answer's `Table`, or `None` if it has no partition key.
    pub(crate) fn from_description(table: &Value) -> Option<KeySchema> {
        let mut partition = None;
        let mut sort = None;
        for element in table.get("KeySchema")?.as_array()? {
            let name = element.get("AttributeName")?.as_str()?.to_owned();
            match element.get("KeyType")?.as_str()? {
                "HASH" => partition = Some(name),
                "RANGE" => sort = Some(name),
                _ => {}
            }
        }
        Some(KeySchema {
            partition: partition?,
            sort,
        })
    }

    /// The item in `table` whose key attributes `attributes` holds (a `Key`, or a whole
    /// `Item`); `None` if one is missing or not a key type.
    pub(crate) fn item_id(&self, table: &str, attributes: &Map<String, Value>) -> Option<ItemId> {
        let mut key = key_text(attributes.get(&self.partition)?)?;
        let partition_len = key.len();
        if let Some(sort) = &self.sort {
            key.push('/');
            key.push_str(&key_text(attributes.get(sort)?)?);
        }
        Some(ItemId {
            table: table.to_owned(),
            key,
            partition_len,
        })
    }

    /// The key attributes of `item`, as a `Key` to read it by.
    pub(crate) fn key_of(&self, item: &Map<String, Value>) -> Map<String, Value> {
        std::iter::once(&self.partition)
            .chain(&self.sort)
            .filter_map(|name| Some((name.clone(), item.get(name)?.clone())))
            .collect()
    }
}

/// The text of a key value: a string as is, a number canonical, binary as its base64.
fn key_text(value: &Value) -> Option<String> {
    let (kind, payload) = value.as_object()?.iter().next()?;
    let text = payload.as_str()?;
    match kind.as_str() {
        "S" | "B" => Some(text.to_owned()),
        "N" => Some(Decimal::parse(text)?.canonical()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema(description: Value) -> KeySchema {
        KeySchema::from_description(&description).unwrap()
    }

    #[test]
    fn an_item_is_named_by_its_table_and_key_values() {
        let simple = schema(json!({"KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}]}));
        let item = json!({"pk": {"S": "a"}, "v": {"N": "1"}});
        let id = simple.item_id("t", item.as_object().unwrap()).unwrap();
        assert_eq!(id.to_string(), "t/a");
        assert_eq!(
            simple.key_of(item.as_object().unwrap()),
            *json!({"pk": {"S": "a"}}).as_object().unwrap()
        );

        let composite = schema(json!({"KeySchema": [
            {"AttributeName": "sk", "KeyType": "RANGE"},
            {"AttributeName": "pk", "KeyType": "HASH"}
        ]}));
        let key = json!({"pk": {"S": "a"}, "sk": {"N": "1.50"}});
        let id = composite.item_id("t", key.as_object().unwrap()).unwrap();
        assert_eq!(id.to_string(), "t/a/1.5");
        assert_eq!(id.partition_key(), "a");
        let partial = json!({"pk": {"S": "a"}});
        assert_eq!(composite.item_id("t", partial.as_object().unwrap()), None);
    }
}
