//! Compile-time behaviour of `#[rate_limited]`: every supported form compiles, every misuse
//! fails with a spanned message naming what was expected.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
