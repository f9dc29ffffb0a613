//! Which item a request names: its table and key, read through the table's key schema.

use std::fmt;

use serde_json::{Map, Value};

use crate::number::Decimal;
use crate::size::item_size;

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

    /// Whether this is an item of `table` or an entry of one of its indexes.
    pub(crate) fn of_table(&self, table: &str) -> bool {
        self.table
            .strip_prefix(table)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("/index/"))
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

/// A table's key attributes, and the partition key of each of its global secondary
/// indexes (an index places its entries by that key alone, as a table places its items).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySchema {
    partition: String,
    sort: Option<String>,
    indexes: Vec<(String, String)>,
}

/// What the proxy knows of an item for billing its writes: its size in bytes (0: no item)
/// and the index entries it has, one per global secondary index whose partition key it
/// carries (named as items of the index: `{table}/index/{index}` and the key's value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) size: u64,
    pub(crate) index: Vec<ItemId>,
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
        let indexes = table
            .get("GlobalSecondaryIndexes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|index| {
                let name = index.get("IndexName")?.as_str()?;
                let hash = index
                    .get("KeySchema")?
                    .as_array()?
                    .iter()
                    .find(|e| e.get("KeyType").and_then(Value::as_str) == Some("HASH"))?;
                Some((
                    name.to_owned(),
                    hash.get("AttributeName")?.as_str()?.to_owned(),
                ))
            })
            .collect();
        Some(KeySchema {
            partition: partition?,
            sort,
            indexes,
        })
    }

    /// What `item` of `table` (its whole attributes; none: no item) is for billing.
    pub(crate) fn shape(&self, table: &str, item: &Map<String, Value>) -> Shape {
        if item.is_empty() {
            return Shape::default();
        }
        let index = self
            .indexes
            .iter()
            .filter_map(|(name, attribute)| {
                let key = key_text(item.get(attribute)?)?;
                Some(ItemId {
                    table: format!("{table}/index/{name}"),
                    partition_len: key.len(),
                    key,
                })
            })
            .collect();
        Shape {
            size: item_size(item),
            index,
        }
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
