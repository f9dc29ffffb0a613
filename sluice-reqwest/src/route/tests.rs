use super::*;

fn url(s: &str) -> Url {
    s.parse().unwrap()
}

fn dims(route: Option<&Route>) -> Vec<&str> {
    route
        .map(|r| r.limits().iter().map(|l| l.dimension().as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn vendor_hosts_map_to_their_dimensions_and_others_to_nothing() {
    let routes = Routes::vendors();
    let cases = [
        (
            "https://api.openai.com/v1/chat/completions",
            vec!["openai#rpm"],
        ),
        ("https://API.OpenAI.com:8443/v1/models", vec!["openai#rpm"]),
        (
            "https://api.anthropic.com/v1/messages",
            vec!["anthropic#rpm"],
        ),
        (
            "https://api.elevenlabs.io/v1/text-to-speech/x",
            vec!["elevenlabs#concurrent"],
        ),
        (
            "https://api.deepgram.com/v1/listen",
            vec!["deepgram#concurrent"],
        ),
        ("https://example.com/v1/chat/completions", vec![]),
        ("https://openai.com/", vec![]),
        ("https://api.openai.com.evil.test/", vec![]),
    ];
    for (u, want) in cases {
        assert_eq!(dims(routes.find(&url(u))), want, "{u}");
    }
}

#[test]
fn the_longest_path_prefix_wins_and_routes_replace_by_host_and_prefix() {
    let routes = Routes::vendors()
        .route(
            Route::new("api.openai.com")
                .path_prefix("/v1/embeddings")
                .limit(Limit::parse("openai#embed").unwrap()),
        )
        .route(Route::new("api.openai.com").limit(Limit::parse("openai#all").unwrap()));
    assert_eq!(
        dims(routes.find(&url("https://api.openai.com/v1/embeddings"))),
        ["openai#embed"]
    );
    assert_eq!(
        dims(routes.find(&url("https://api.openai.com/v1/chat/completions"))),
        ["openai#all"]
    );
    let without = routes.without("API.OPENAI.COM");
    assert!(
        without
            .find(&url("https://api.openai.com/v1/models"))
            .is_none()
    );
    assert!(
        Routes::empty()
            .find(&url("https://api.openai.com/"))
            .is_none()
    );
}

#[test]
fn costs_are_per_call_fixed_or_estimated() {
    let request = reqwest::Client::new()
        .post("http://api.openai.com/v1/chat/completions")
        .body("12345678")
        .build()
        .unwrap();
    let acquire = [
        Limit::parse("a#per-call").unwrap(),
        Limit::parse("a#fixed").unwrap().cost(3),
        Limit::parse("a#estimated")
            .unwrap()
            .estimate(|r: &Request| {
                r.body()
                    .and_then(|b| b.as_bytes())
                    .map(|b| Tokens::new(b.len() as i64))
            }),
        Limit::parse("a#fallback")
            .unwrap()
            .estimate(|_: &Request| None),
    ]
    .iter()
    .fold(Acquire::default(), |a, l| l.add_to(a, &request));
    let want = Acquire::new("a#per-call")
        .and_cost("a#fixed", 3)
        .and_cost("a#estimated", 8)
        .and("a#fallback");
    assert_eq!(acquire, want);
    assert!(Limit::parse("no-hash").is_err());
}
