//! Item sizes as DynamoDB bills them: attribute names plus values, with the overheads of
//! the developer guide's "item sizes and formats".

use serde_json::{Map, Value};

use crate::number::Decimal;

/// The size in bytes of an item in DynamoDB JSON (`{"name": {"S": "x"}, …}`).
pub(crate) fn item_size(item: &Map<String, Value>) -> u64 {
    item.iter()
        .map(|(name, value)| name.len() as u64 + value_size(value))
        .sum()
}

/// The size of one typed attribute value, without its name. Unknown types count nothing:
/// the upstream refuses them anyway.
pub(crate) fn value_size(value: &Value) -> u64 {
    let Some((kind, payload)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    match (kind.as_str(), payload) {
        ("S", Value::String(s)) => s.len() as u64,
        ("N", Value::String(n)) => number_size(n),
        ("B", Value::String(b)) => binary_size(b),
        ("BOOL" | "NULL", _) => 1,
        ("L", Value::Array(elements)) => {
            3 + elements.iter().map(|e| 1 + value_size(e)).sum::<u64>()
        }
        ("M", Value::Object(fields)) => {
            3 + fields
                .iter()
                .map(|(name, v)| 1 + name.len() as u64 + value_size(v))
                .sum::<u64>()
        }
        // Sets: the sum of their elements. The guide gives no formula for sets, so this
        // is an assumption.
        ("SS", Value::Array(elements)) => elements
            .iter()
            .filter_map(Value::as_str)
            .map(|s| s.len() as u64)
            .sum(),
        ("NS", Value::Array(elements)) => elements
            .iter()
            .filter_map(Value::as_str)
            .map(number_size)
            .sum(),
        ("BS", Value::Array(elements)) => elements
            .iter()
            .filter_map(Value::as_str)
            .map(binary_size)
            .sum(),
        _ => 0,
    }
}

/// One byte per two significant digits, plus one.
fn number_size(text: &str) -> u64 {
    Decimal::parse(text).map_or(1, |d| d.significant_digits().div_ceil(2) + 1)
}

/// The raw length of base64 text, without decoding it.
fn binary_size(base64: &str) -> u64 {
    let symbols = base64.trim_end_matches('=').len() as u64;
    symbols * 3 / 4
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn size(item: Value) -> u64 {
        item_size(item.as_object().unwrap())
    }

    #[test]
    fn strings_count_name_and_utf8_bytes() {
        assert_eq!(size(json!({"pk": {"S": "abc"}})), 5);
        assert_eq!(size(json!({"pk": {"S": "é"}})), 4);
    }

    #[test]
    fn numbers_count_one_byte_per_two_significant_digits_plus_one() {
        assert_eq!(size(json!({"n": {"N": "1"}})), 1 + 2);
        assert_eq!(size(json!({"n": {"N": "12"}})), 1 + 2);
        assert_eq!(size(json!({"n": {"N": "123"}})), 1 + 3);
        assert_eq!(size(json!({"n": {"N": "1000"}})), 1 + 2);
        assert_eq!(size(json!({"n": {"N": "-0.00125"}})), 1 + 3);
        assert_eq!(size(json!({"n": {"N": "0"}})), 1 + 1);
    }

    #[test]
    fn binary_counts_its_raw_length_not_its_base64_length() {
        assert_eq!(size(json!({"b": {"B": "AAECAw=="}})), 1 + 4);
        assert_eq!(size(json!({"b": {"B": "AAECAwQ="}})), 1 + 5);
        assert_eq!(size(json!({"b": {"B": "AAECAwQF"}})), 1 + 6);
    }

    #[test]
    fn bool_and_null_count_one_byte() {
        assert_eq!(
            size(json!({"t": {"BOOL": true}, "z": {"NULL": true}})),
            2 + 2
        );
    }

    #[test]
    fn lists_and_maps_add_three_bytes_and_one_per_element() {
        assert_eq!(size(json!({"l": {"L": []}})), 1 + 3);
        assert_eq!(size(json!({"m": {"M": {}}})), 1 + 3);
        assert_eq!(
            size(json!({"l": {"L": [{"S": "ab"}, {"N": "1"}]}})),
            1 + 3 + (1 + 2) + (1 + 2)
        );
        assert_eq!(
            size(json!({"m": {"M": {"k": {"S": "ab"}, "kk": {"BOOL": false}}}})),
            1 + 3 + (1 + 1 + 2) + (1 + 2 + 1)
        );
    }

    #[test]
    fn sets_count_the_sum_of_their_elements() {
        assert_eq!(size(json!({"s": {"SS": ["a", "bc"]}})), 1 + 3);
        assert_eq!(size(json!({"s": {"NS": ["1", "123"]}})), 1 + 2 + 3);
        assert_eq!(size(json!({"s": {"BS": ["AAE=", "AA=="]}})), 1 + 2 + 1);
    }
}
