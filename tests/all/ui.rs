//! `#[kernel]` compile errors, each at the right span (`tests/ui/*.rs` with their
//! `.stderr`), and programs that must compile and run (`tests/ui/pass/*.rs`).
//! Regenerate expectations after an intended change with `TRYBUILD=overwrite`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
