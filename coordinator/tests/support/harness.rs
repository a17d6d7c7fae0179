//! The `main` of the `harness = false` test binaries, with libtest's command line.

use std::borrow::Borrow;
use std::time::Instant;

/// A named test of a context `T`.
pub type Test<T> = (&'static str, fn(&T));

/// Runs `child` when the environment variable `variable` is `role` (a test re-running its
/// binary as a helper process): whether it did, so that `main` then runs no test.
pub fn as_child(variable: &str, role: &str, child: fn()) -> bool {
    let is_child = std::env::var(variable).as_deref() == Ok(role);
    if is_child {
        child();
    }
    is_child
}

/// Runs `tests` in order, each with one context shared by all of them, built by `setup`
/// before the first test that runs (never when every test is filtered out). Like libtest:
/// positional arguments are name filters; flags (`--nocapture`, ...) are accepted and ignored.
pub fn run<C: Borrow<T>, T: ?Sized>(tests: &[Test<T>], mut setup: impl FnMut() -> C) {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let mut context = None;
    let (mut passed, mut skipped) = (0, 0);
    for &(name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|filter| name.contains(filter.as_str())) {
            continue;
        }
        println!("test {name} ...");
        let started = Instant::now();
        let shared: &C = context.get_or_insert_with(&mut setup);
        cuinterpose_testkit::skip::take_skips();
        test(shared.borrow());
        // A test that called `unavailable` (skips allowed) did not run: never an `ok`.
        let skips = cuinterpose_testkit::skip::take_skips();
        if skips.is_empty() {
            passed += 1;
            println!("test {name} ... ok ({:.1?})", started.elapsed());
        } else {
            skipped += 1;
            for (what, why) in skips {
                println!("test {name} ... SKIPPED ({what}: {why})");
            }
        }
    }
    println!(
        "test result: ok. {passed} passed; {skipped} skipped; {} filtered out",
        tests.len() - passed - skipped
    );
}
