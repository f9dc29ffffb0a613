//! What the `sluice` operator binary reads from its users, kept in the library so the
//! fuzz harness reaches it too; not a public API.
//!
//! The binary's command-line definitions (`--type`, `--refill`, `--reserve`, …) and its
//! bucket file (`sluice apply`) both end in [`bucket`]; refill rates are read by [`rate`],
//! reserves by [`reserve`] and [`amount`]; the file is read by [`parse`].

mod bucket_file;

pub use crate::text::{Amount, amount, bucket, rate, reserve};
pub use bucket_file::parse;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bucket, LimitType, Priority, RefillRate, Tokens};

    #[test]
    fn rates_are_amounts_per_unit() {
        assert_eq!(rate("500/min"), Ok(RefillRate::per_minute(500)));
        assert_eq!(rate("10/s"), Ok(RefillRate::per_second(10)));
        assert_eq!(rate("1000 / hour"), Ok(RefillRate::per_hour(1000)));
        assert_eq!(rate("50000/day"), Ok(RefillRate::per_day(50_000)));
        assert_eq!(rate("1.5/s"), Ok("1.5".parse().unwrap()));
        assert_eq!(rate("3/week"), Ok(RefillRate::per_week(3)));
        assert_eq!(
            rate("7/7.001s"),
            Ok(RefillRate::new(7, std::time::Duration::from_millis(7_001)))
        );
        for bad in ["500", "500/fortnight", "x/min", "0/s", "-3/s", "/s"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reserves_are_tokens_or_shares_of_the_capacity() {
        let p = |s: &str| Priority::new(s).unwrap();
        assert_eq!(
            reserve("interactive=20%"),
            Ok((p("interactive"), Amount::Percent(Tokens::new(20))))
        );
        assert_eq!(
            reserve(" batch = 1.5 "),
            Ok((p("batch"), Amount::Tokens("1.5".parse().unwrap())))
        );
        for bad in [
            "interactive",
            "a b=3",
            "x=0",
            "x=-1%",
            "x=101%",
            "x=lots",
            "=3",
        ] {
            assert!(reserve(bad).is_err(), "{bad}");
        }
        let tpm = bucket(
            LimitType::Tokens,
            None,
            Some(RefillRate::per_minute(2_000_000)),
            None,
            false,
            &[
                (p("interactive"), Amount::Percent("12.5".parse().unwrap())),
                (p("standard"), Amount::Tokens(Tokens::new(100_000))),
            ],
        )
        .unwrap();
        assert_eq!(tpm.floor_for(Some(&p("standard"))), Tokens::new(250_000));
        assert_eq!(tpm.floor_for(Some(&p("batch"))), Tokens::new(350_000));
        let slots = |n: i64, shares: &[(&str, i64)]| {
            let percent =
                |(name, share): &(&str, i64)| (p(name), Amount::Percent(Tokens::new(*share)));
            let reserves: Vec<_> = shares.iter().map(percent).collect();
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(n)),
                None,
                None,
                false,
                &reserves,
            )
        };
        let too_much = slots(4, &[("a", 60), ("b", 60)]);
        assert!(too_much.unwrap_err().contains("more than the capacity"));
        // A quarter of 10 slots is 3 slots kept free, not 2.5.
        let voice = slots(10, &[("live", 25)]).unwrap();
        assert_eq!(voice.reserved(), Tokens::new(3));
    }

    /// A bucket from flags, without reserves; the error's text when refused.
    fn flags(
        kind: LimitType,
        capacity: Option<i64>,
        refill: Option<RefillRate>,
        cost: Option<i64>,
        lean: bool,
    ) -> Result<Bucket, String> {
        let tokens = |t: Option<i64>| t.map(Tokens::new);
        bucket(kind, tokens(capacity), refill, tokens(cost), lean, &[])
    }

    #[test]
    fn definitions_say_what_is_missing() {
        use LimitType::{Concurrent, Requests};
        let per_minute = RefillRate::per_minute(500);
        let rpm = Some(per_minute);
        let refused = |b: Result<Bucket, String>, why: &str| {
            assert!(b.as_ref().unwrap_err().contains(why), "{b:?}: {why}");
        };
        assert_eq!(
            flags(Requests, None, rpm, None, false),
            Ok(Bucket::requests(per_minute))
        );
        assert_eq!(
            flags(Concurrent, Some(5), None, None, false),
            Ok(Bucket::concurrent(5))
        );
        refused(flags(Requests, None, None, None, false), "refill rate");
        refused(flags(Concurrent, None, None, None, false), "capacity");
        refused(
            flags(Concurrent, Some(5), rpm, None, false),
            "does not refill",
        );
        assert!(flags(Requests, Some(2), rpm, Some(3), false).is_err());
        let lean = Bucket::requests(per_minute).lean();
        assert_eq!(flags(Requests, None, rpm, None, true), Ok(lean));
        refused(
            flags(Concurrent, Some(5), None, None, true),
            "cannot be lean",
        );
    }
}
