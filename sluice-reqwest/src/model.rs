//! Which of a route's per-model limits a model takes.

/// The limits of the pattern that best matches `model`: an exact name, else the longest
/// `prefix*` pattern it starts with.
pub(crate) fn best<'a, T>(rules: &'a [(String, T)], model: &str) -> Option<&'a T> {
    rules
        .iter()
        .filter_map(|(pattern, limits)| {
            let rank = match pattern.strip_suffix('*') {
                Some(prefix) if model.starts_with(prefix) => prefix.len(),
                Some(_) => return None,
                None if pattern == model => usize::MAX,
                None => return None,
            };
            Some((rank, limits))
        })
        .max_by_key(|(rank, _)| *rank)
        .map(|(_, limits)| limits)
}

#[cfg(test)]
mod tests {
    use super::best;

    #[test]
    fn exact_names_beat_patterns_and_longer_patterns_beat_shorter() {
        let rules = vec![
            ("gpt-4o*".to_owned(), "4o family"),
            ("gpt-4o-mini*".to_owned(), "mini family"),
            ("gpt-4o-mini".to_owned(), "mini"),
            ("*".to_owned(), "anything"),
        ];
        let cases = [
            ("gpt-4o-mini", Some(&"mini")),
            ("gpt-4o-mini-2024-07-18", Some(&"mini family")),
            ("gpt-4o-2024-08-06", Some(&"4o family")),
            ("o3", Some(&"anything")),
        ];
        for (model, want) in cases {
            assert_eq!(best(&rules, model), want, "{model}");
        }
        assert_eq!(best(&rules[..3], "o3"), None);
    }
}
