//! The counters over HTTP: `GET /_fidelity/stats`, `POST /_fidelity/reset`,
//! `POST /_fidelity/ceilings`, `POST /_fidelity/latency`.

use bytes::Bytes;
use dynamodb_fidelity::{Config, fetch_stats};
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::common::{key, sized_item, with_proxy};

/// `method` on `endpoint` + `path` with `body`: the status and the body as JSON.
async fn call(method: Method, url: String, body: &str) -> (StatusCode, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stats_endpoint_reports_per_item_counters() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("counted", 1500).await;
        h.client
            .get_item()
            .table_name(&h.table)
            .set_key(Some(key("counted")))
            .send()
            .await
            .unwrap();
        let endpoint = h.proxy.endpoint();
        let fetched = fetch_stats(&endpoint).await.unwrap();
        assert_eq!(fetched, h.proxy.stats());
        let counted = fetched.item(&h.table, "counted").unwrap();
        assert_eq!(counted.requests, 2);
        assert_eq!(counted.successful_writes, 1);
        assert_eq!(counted.write_units, 2);
        assert_eq!(counted.read_half_units, 1);
        assert_eq!(counted.largest_item_size, 1500);
        assert_eq!(fetched.totals().requests, 2);

        let (status, json) = call(Method::GET, format!("{endpoint}/_fidelity/stats"), "").await;
        assert_eq!(status, StatusCode::OK);
        let item = &json["items"][format!("{}/counted", h.table)];
        for (field, value) in [
            ("requests", 2),
            ("successful_writes", 1),
            ("failed_conditional_writes", 0),
            ("write_units", 2),
            ("read_half_units", 1),
            ("throttled_writes", 0),
            ("throttled_reads", 0),
            ("transaction_conflicts", 0),
            ("transactions_cancelled", 0),
            ("largest_item_size", 1500),
        ] {
            assert_eq!(item[field], value, "{field} in {json}");
        }
        assert_eq!(json["totals"]["write_units"], 2, "{json}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_zeroes_the_counters() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("counted", 100).await;
        assert_eq!(h.proxy.stats().totals().write_units, 1);
        let endpoint = h.proxy.endpoint();
        let (status, _) = call(Method::POST, format!("{endpoint}/_fidelity/reset"), "").await;
        assert_eq!(status, StatusCode::OK);
        let stats = fetch_stats(&endpoint).await.unwrap();
        assert_eq!(stats, dynamodb_fidelity::Stats::default());
        assert_eq!(stats.items().count(), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceilings_change_over_http_and_bad_ones_are_refused() {
    with_proxy(Config::default(), |h| async move {
        let endpoint = h.proxy.endpoint();
        let url = format!("{endpoint}/_fidelity/ceilings");
        let (status, _) = call(Method::POST, url.clone(), r#"{"write": 1, "read": 3000}"#).await;
        assert_eq!(status, StatusCode::OK);
        // A second's burst of one unit: a 2-unit put overdraws it, the next is throttled.
        let put = || {
            h.client
                .put_item()
                .table_name(&h.table)
                .set_item(Some(sized_item("slowed", 2000)))
                .send()
        };
        put().await.unwrap();
        let error = put().await.unwrap_err().into_service_error();
        assert!(
            error.is_provisioned_throughput_exceeded_exception(),
            "{error:?}"
        );

        for bad in [r#"{"write": -1, "read": 1}"#, r#"{"write": 1}"#, "nonsense"] {
            let (status, json) = call(Method::POST, url.clone(), bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {json}");
            assert!(json["message"].is_string());
        }
        let (status, _) = call(Method::GET, format!("{endpoint}/_fidelity/nothing"), "").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_functions_reset_and_set_the_ceilings() {
    with_proxy(Config::default(), |h| async move {
        let endpoint = h.proxy.endpoint();
        h.put_sized("counted", 100).await;
        dynamodb_fidelity::reset_stats(&endpoint).await.unwrap();
        assert_eq!(
            fetch_stats(&endpoint).await.unwrap().totals().write_units,
            0
        );
        dynamodb_fidelity::set_ceilings(&endpoint, 1.0, 3000.0)
            .await
            .unwrap();
        let put = || {
            h.client
                .put_item()
                .table_name(&h.table)
                .set_item(Some(sized_item("slowed", 2000)))
                .send()
        };
        put().await.unwrap();
        assert!(put().await.is_err(), "throttled at one unit a second");
        let refused = dynamodb_fidelity::set_ceilings(&endpoint, -1.0, 1.0).await;
        assert!(
            matches!(refused, Err(dynamodb_fidelity::Error::Fetch { .. })),
            "{refused:?}"
        );
        let unreachable = dynamodb_fidelity::reset_stats("https://127.0.0.1:1").await;
        assert!(
            matches!(unreachable, Err(dynamodb_fidelity::Error::Endpoint(_))),
            "{unreachable:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_takes_at_least_the_latency_set_and_none_is_added_once_unset() {
    use std::time::{Duration, Instant};
    with_proxy(Config::default(), |h| async move {
        h.put_sized("slow", 100).await;
        let get = || async {
            let started = Instant::now();
            h.client
                .get_item()
                .table_name(&h.table)
                .set_key(Some(key("slow")))
                .send()
                .await
                .unwrap();
            started.elapsed()
        };
        // Only a lower bound is checked: how much more a loaded machine adds is its own.
        let base = Duration::from_millis(40);
        dynamodb_fidelity::set_latency(
            &h.proxy.endpoint(),
            dynamodb_fidelity::Latency {
                base,
                tail: Duration::ZERO,
            },
        )
        .await
        .unwrap();
        for _ in 0..3 {
            assert!(get().await >= base);
        }
        h.proxy.set_latency(dynamodb_fidelity::Latency::default());
        let quickest = futures::future::join_all((0..5).map(|_| get())).await;
        assert!(quickest.iter().any(|d| *d < base), "{quickest:?}");
        // A body that is not a latency is refused, and says what it expects.
        let url = format!("{}/_fidelity/latency", h.proxy.endpoint());
        let (status, json) = call(Method::POST, url, "{\"base\": 1}").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            json["message"].as_str().unwrap().contains("base_us"),
            "{json}"
        );
    })
    .await;
}
