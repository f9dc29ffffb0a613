//! Time to live as DynamoDB runs it: an expired item is deleted "typically within two
//! days", so within a run it is still read, scanned and billed; the proxy keeps the
//! table's TTL setting and answers for it, refusing what DynamoDB refuses.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveSpecification, TimeToLiveStatus};
use dynamodb_fidelity::Config;

use crate::common::{Harness, client, endpoint, key, sized_item, with_proxy};

async fn set_ttl(h: &Harness, enabled: bool) -> Result<(), String> {
    h.client
        .update_time_to_live()
        .table_name(&h.table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("ttl")
                .enabled(enabled)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .map(|_| ())
        .map_err(|e| format!("{:?}", e.into_service_error()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_item_stays_readable_and_billed_and_the_setting_is_the_proxy_s() {
    with_proxy(Config::default(), |h| async move {
        assert_eq!(set_ttl(&h, true).await, Ok(()));
        let described = h
            .client
            .describe_time_to_live()
            .table_name(&h.table)
            .send()
            .await
            .unwrap();
        let description = described.time_to_live_description().unwrap();
        assert_eq!(
            description.time_to_live_status(),
            Some(&TimeToLiveStatus::Enabled)
        );
        assert_eq!(description.attribute_name(), Some("ttl"));
        // On again, or off within the hour: refused, as DynamoDB refuses them.
        let again = set_ttl(&h, true).await.unwrap_err();
        assert!(again.contains("ValidationException"), "{again}");
        let off = set_ttl(&h, false).await.unwrap_err();
        assert!(off.contains("ValidationException"), "{off}");
        // The upstream was never told: nothing there sweeps an item early.
        let direct = client(&endpoint().unwrap());
        let upstream = direct
            .describe_time_to_live()
            .table_name(&h.table)
            .send()
            .await
            .unwrap();
        assert_ne!(
            upstream
                .time_to_live_description()
                .and_then(|d| d.time_to_live_status()),
            Some(&TimeToLiveStatus::Enabled)
        );
        // An item that expired an hour ago is still there, and reading it is billed.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut item = sized_item("expired", 100);
        item.insert(
            "ttl".to_owned(),
            AttributeValue::N((now - 3_600).to_string()),
        );
        h.client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let read = h
            .client
            .get_item()
            .table_name(&h.table)
            .set_key(Some(key("expired")))
            .send()
            .await
            .unwrap();
        assert!(read.item().is_some());
        assert_eq!(h.item("expired").read_half_units, 1);
    })
    .await;
}
