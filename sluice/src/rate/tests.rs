use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn rate(text: &str) -> RefillRate {
    text.parse().unwrap()
}

#[test]
fn a_rate_refills_exactly_what_its_owner_wrote_per_period() {
    let day = Duration::from_secs(86_400);
    assert_eq!(RefillRate::per_day(1).refill_over(day), Tokens::new(1));
    assert_eq!(
        RefillRate::per_day(1).refill_over(day * 365),
        Tokens::new(365)
    );
    assert_eq!(
        RefillRate::per_hour(1).refill_over(Duration::from_secs(3_600)),
        Tokens::new(1)
    );
    assert_eq!(
        RefillRate::per_minute(500).refill_over(Duration::from_secs(60)),
        Tokens::new(500)
    );
    assert_eq!(
        RefillRate::per_week(3).refill_over(Duration::from_secs(604_800)),
        Tokens::new(3)
    );
    let odd = RefillRate::new(7, Duration::from_millis(7_001));
    assert_eq!(
        odd.refill_over(Duration::from_millis(7_001)),
        Tokens::new(7)
    );
    // Just short of a period: less, rounded down to the billionth.
    assert_eq!(
        RefillRate::per_day(1).refill_over(day - Duration::from_millis(1)),
        Tokens::from_nanos(999_999_988)
    );
}

#[test]
fn the_text_form_names_the_period_as_people_write_it() {
    assert_eq!(RefillRate::per_second(10).to_string(), "10/s");
    assert_eq!(RefillRate::per_minute(500).to_string(), "500/min");
    assert_eq!(RefillRate::per_minute(120).to_string(), "2/s");
    assert_eq!(RefillRate::per_hour(1).to_string(), "1/h");
    assert_eq!(RefillRate::per_day(1).to_string(), "1/day");
    assert_eq!(RefillRate::per_week(1).to_string(), "1/week");
    assert_eq!(
        RefillRate::new(1, Duration::from_secs(2)).to_string(),
        "30/min"
    );
    assert_eq!(
        RefillRate::new(7, Duration::from_millis(7_001)).to_string(),
        "7/7.001s"
    );
    assert_eq!(
        rate("0.000011574074074074").to_string(),
        "0.000011574074074074/s"
    );
    assert_eq!(
        RefillRate::from_nanos_per_second(1).to_string(),
        "0.000000001/s"
    );
    assert_eq!(RefillRate::MAX.to_string(), "1000000000000000/s");
    assert_eq!(RefillRate::ZERO.to_string(), "0/s");
}

#[test]
fn the_text_form_reads_units_and_multiples() {
    assert_eq!(rate("500/min"), RefillRate::per_minute(500));
    assert_eq!(rate("500 / minute"), RefillRate::per_minute(500));
    assert_eq!(rate("1/day"), RefillRate::per_day(1));
    assert_eq!(rate("2/week"), RefillRate::per_week(2));
    assert_eq!(rate("1/2h"), RefillRate::new(1, Duration::from_secs(7_200)));
    assert_eq!(rate("5/100ms"), RefillRate::per_second(50));
    assert_eq!(
        rate("7/7.001s"),
        RefillRate::new(7, Duration::from_millis(7_001))
    );
    assert_eq!(rate("0.5/s"), rate("30/min"));
    assert_eq!(
        rate("1.667"),
        RefillRate::from_nanos_per_second(1_667_000_000)
    );
    for bad in [
        "500/fortnight",
        "abc",
        "5/",
        "/s",
        "5/0s",
        "5/-1s",
        "5/1.5.2s",
        "5/s/s",
    ] {
        assert!(
            bad.parse::<RefillRate>().is_err(),
            "{bad:?} should not read"
        );
    }
}

#[test]
fn a_row_stores_tokens_per_second_to_38_digits_and_says_when_that_is_exact() {
    assert_eq!(
        RefillRate::per_second(10).stored_decimal(),
        ("10".to_owned(), true)
    );
    assert_eq!(
        rate("0.000011574074074074").stored_decimal(),
        ("0.000011574074074074".to_owned(), true)
    );
    let (text, exact) = RefillRate::per_minute(500).stored_decimal();
    assert_eq!(text, format!("8.{}", "3".repeat(37)));
    assert!(!exact);
    let (text, exact) = RefillRate::per_day(1).stored_decimal();
    assert_eq!(text, "0.000011574074074074074074074074074074074074");
    assert_eq!(text.trim_start_matches(['0', '.']).len(), 38);
    assert!(!exact);
    assert_eq!(
        RefillRate::per_minute(500).stored_interval(),
        (
            format!("8.{}", "3".repeat(37)),
            format!("8.{}4", "3".repeat(36))
        )
    );
    assert_eq!(next_up("9.99"), "10.00");
    assert_eq!(next_up("-0.19"), "-0.20");
}

#[test]
fn a_rate_in_parts_reads_back_as_written() {
    let (amount, period) = RefillRate::per_minute(500).amount_per_period();
    assert_eq!(
        (amount, period),
        (500 * NANOS_PER_TOKEN, 60 * NANOS_PER_SECOND)
    );
    assert_eq!(
        RefillRate::from_parts(amount, period),
        Some(RefillRate::per_minute(500))
    );
    let odd = RefillRate::new(7, Duration::from_millis(7_001));
    let (amount, period) = odd.amount_per_period();
    assert_eq!((amount, period), (7 * NANOS_PER_TOKEN, 7_001_000_000));
    assert_eq!(RefillRate::from_parts(1, 0), None);
}

#[test]
fn rates_order_by_value() {
    assert!(RefillRate::per_minute(500) < RefillRate::per_second(9));
    assert!(RefillRate::per_minute(500) > RefillRate::per_second(8));
    assert!(RefillRate::ZERO < RefillRate::per_week(1));
    assert!(rate("-1") < RefillRate::ZERO);
    assert_eq!(
        RefillRate::per_minute(60).cmp(&RefillRate::per_second(1)),
        Ordering::Equal
    );
    assert_eq!(RefillRate::per_second(5).scaled(10, 100), rate("0.5/s"));
    assert_eq!(
        RefillRate::per_day(10).scaled(1, 10),
        RefillRate::per_day(1)
    );
}

#[test]
fn a_rate_per_millisecond_is_reduced() {
    let per = RefillRate::per_day(1).per_milli().unwrap();
    assert_eq!(
        (per.num, per.den),
        (U256::from(625_u32), U256::from(54_u32))
    );
    let per = RefillRate::per_second(10).per_milli().unwrap();
    assert_eq!((per.num, per.den), (U256::from(10_000_000_u32), U256::ONE));
    assert_eq!(RefillRate::ZERO.per_milli(), None);
}

/// Any rate `RefillRate::new` builds: an amount up to 10^12 tokens in billionths, a period
/// from a nanosecond to about three years.
fn any_rate() -> impl Strategy<Value = RefillRate> {
    (
        1i128..1_000_000_000_000_000_000_000,
        1u64..100_000_000_000_000_000,
    )
        .prop_map(|(amount, period)| {
            RefillRate::new(Tokens::from_nanos(amount), Duration::from_nanos(period))
        })
}

proptest! {
    #[test]
    fn the_text_form_reads_back_as_the_same_rate(rate in any_rate()) {
        prop_assert_eq!(rate.to_string().parse::<RefillRate>().unwrap(), rate);
    }

    #[test]
    fn a_rate_in_parts_reads_back_as_the_same_rate(rate in any_rate()) {
        let (amount, period) = rate.amount_per_period();
        prop_assert_eq!(RefillRate::from_parts(amount, period), Some(rate));
    }

    #[test]
    fn the_stored_decimal_is_the_rate_rounded_toward_zero(rate in any_rate()) {
        let (text, exact) = rate.stored_decimal();
        let stored = RefillRate::parse_rounded(&text, Rounding::Floor).unwrap();
        prop_assert!(stored <= rate);
        prop_assert_eq!(exact, stored == rate);
        let (low, high) = rate.stored_interval();
        prop_assert_eq!(&low, &text);
        let high = RefillRate::parse_rounded(&high, Rounding::Floor).unwrap();
        prop_assert!(exact || rate < high);
    }

    #[test]
    fn whole_periods_refill_whole_amounts(
        amount in 1u64..1_000_000,
        period_ms in 1u64..604_800_000,
        periods in 1u32..1_000,
    ) {
        let rate = RefillRate::new(amount, Duration::from_millis(period_ms));
        let span = Duration::from_millis(period_ms) * periods;
        prop_assert_eq!(
            rate.refill_over(span),
            Tokens::new(i64::try_from(amount).unwrap() * i64::from(periods))
        );
    }
}
