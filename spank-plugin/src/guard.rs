//! The panic boundary every C entry point goes through: a panic never unwinds into Slurm; it is
//! logged in kace's message form and replaced by a return code chosen per hook.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; if it panics, reports `kace: <phase>: couldn't finish the hook: <cause>` through
/// `report` and returns `on_panic` (-1 where failing is safe, 0 where a failure would drain the
/// node or kill the job).
pub fn run(
    phase: &str,
    on_panic: c_int,
    body: impl FnOnce() -> c_int,
    report: impl Fn(&str),
) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(rc) => rc,
        Err(payload) => {
            let cause = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            let msg = format!("kace: {phase}: couldn't finish the hook: {cause}");
            // Reporting must not unwind out of the boundary either.
            let _ = catch_unwind(AssertUnwindSafe(|| report(&msg)));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn a_normal_return_passes_through_unreported() {
        let seen = RefCell::new(Vec::<String>::new());
        assert_eq!(run("init", -1, || 7, |m| seen.borrow_mut().push(m.into())), 7);
        assert!(seen.borrow().is_empty());
    }

    #[test]
    fn a_panic_is_reported_and_becomes_the_chosen_code() {
        let seen = RefCell::new(Vec::<String>::new());
        let rc = run("user_init", 0, || panic!("boom {}", 1), |m| seen.borrow_mut().push(m.into()));
        assert_eq!(rc, 0);
        assert_eq!(*seen.borrow(), ["kace: user_init: couldn't finish the hook: boom 1"]);
    }

    #[test]
    fn a_panicking_reporter_does_not_escape() {
        let rc = run("option", -1, || panic!("first"), |_| panic!("second"));
        assert_eq!(rc, -1);
    }
}
