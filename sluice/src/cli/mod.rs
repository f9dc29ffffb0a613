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
        let too_much = bucket(
            LimitType::Concurrent,
            Some(Tokens::new(4)),
            None,
            None,
            false,
            &[
                (p("a"), Amount::Percent(Tokens::new(60))),
                (p("b"), Amount::Percent(Tokens::new(60))),
            ],
        );
        assert!(too_much.unwrap_err().contains("more than the capacity"));
        // A quarter of 10 slots is 3 slots kept free, not 2.5.
        let voice = bucket(
            LimitType::Concurrent,
            Some(Tokens::new(10)),
            None,
            None,
            false,
            &[(p("live"), Amount::Percent(Tokens::new(25)))],
        )
        .unwrap();
        assert_eq!(voice.reserved(), Tokens::new(3));
    }

    #[test]
    fn definitions_say_what_is_missing() {
        let rpm = RefillRate::per_minute(500);
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, false, &[]),
            Ok(Bucket::requests(rpm))
        );
        assert_eq!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                false,
                &[]
            ),
            Ok(Bucket::concurrent(5))
        );
        assert!(
            bucket(LimitType::Requests, None, None, None, false, &[])
                .unwrap_err()
                .contains("refill rate")
        );
        assert!(
            bucket(LimitType::Concurrent, None, None, None, false, &[])
                .unwrap_err()
                .contains("capacity")
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                Some(rpm),
                None,
                false,
                &[]
            )
            .unwrap_err()
            .contains("does not refill")
        );
        assert!(
            bucket(
                LimitType::Requests,
                Some(Tokens::new(2)),
                Some(rpm),
                Some(Tokens::new(3)),
                false,
                &[]
            )
            .is_err()
        );
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, true, &[]),
            Ok(Bucket::requests(rpm).lean())
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                true,
                &[]
            )
            .unwrap_err()
            .contains("cannot be lean")
        );
    }
}
