//! Who sent a request, as far as DynamoDB Local cares: it does not check signatures but
//! keeps one database per access key and region of the credential scope, so the proxy's
//! own calls carry the caller's credential headers to reach the caller's tables.

use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, HeaderName, HeaderValue};

const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "x-amz-date", "x-amz-security-token"];

/// A caller's credential headers and the scope they name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caller {
    headers: Vec<(HeaderName, HeaderValue)>,
    scope: String,
    region: String,
}

impl Caller {
    /// The caller of a request with these headers.
    pub(crate) fn of(headers: &HeaderMap) -> Caller {
        let copied = CREDENTIAL_HEADERS
            .iter()
            .filter_map(|name| {
                let name = HeaderName::from_static(name);
                let value = headers.get(&name)?.clone();
                Some((name, value))
            })
            .collect();
        // `AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/<service>/aws4_request, …`
        let credential = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split("Credential=").nth(1))
            .and_then(|v| v.split([',', ' ']).next())
            .unwrap_or("");
        let mut parts = credential.split('/');
        let key = parts.next().unwrap_or("");
        let region = parts
            .nth(1)
            .filter(|r| !r.is_empty())
            .unwrap_or("us-east-1");
        Caller {
            headers: copied,
            scope: format!("{key}/{region}"),
            region: region.to_owned(),
        }
    }

    /// The headers to copy onto the proxy's own calls.
    pub(crate) fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The access key and region: DynamoDB Local's database for this caller.
    pub(crate) fn scope(&self) -> &str {
        &self.scope
    }

    /// The region of the credential scope (`us-east-1` if there is none).
    pub(crate) fn region(&self) -> &str {
        &self.region
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_is_the_access_key_and_region_of_the_credential() {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static(
                "AWS4-HMAC-SHA256 Credential=sluicelocal/20260101/eu-west-2/dynamodb/aws4_request, SignedHeaders=host, Signature=00",
            ),
        );
        headers.insert("x-amz-date", HeaderValue::from_static("20260101T000000Z"));
        let caller = Caller::of(&headers);
        assert_eq!(caller.scope(), "sluicelocal/eu-west-2");
        assert_eq!(caller.region(), "eu-west-2");
        assert_eq!(caller.headers().len(), 2);
    }

    #[test]
    fn an_unsigned_request_is_in_the_default_region() {
        let caller = Caller::of(&HeaderMap::new());
        assert_eq!(caller.region(), "us-east-1");
        assert!(caller.headers().is_empty());
    }
}
