//! What memexec's decode-step kernels that take each row of a step as its own inputs
//! ([`super::attention_probs`], [`super::values_product`]) share: the row counts a kernel is
//! made for, this thread's made kernels, and kernel sources without their comment lines.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::precompiled::Kernel;
use crate::error::Result;

/// Rows one kernel call takes at most; a wider batch runs in calls of at most this many.
pub const ROWS_PER_CALL: usize = 8;

/// The row counts a kernel is made for. A call takes the smallest that holds its rows and fills
/// the unused inputs with row 0's (their blocks are not launched). Why not one kernel for all:
/// MLX's host work per call grows with the kernel's inputs and outputs (their arguments,
/// allocations and source text), and a serial step makes each call once per layer; why not one
/// per count: MLX compiles a custom kernel per name and template constants, about a second each
/// on first use in a process.
pub const ROW_BUCKETS: [usize; 4] = [1, 2, 4, 8];

thread_local! {
    /// The kernels made on this thread, by name (MLX objects stay on the thread that made them).
    static MADE: RefCell<HashMap<String, Rc<Kernel>>> = RefCell::new(HashMap::new());
}

/// The kernel for calls of `rows` rows (at most [`ROWS_PER_CALL`]) and the row count it takes
/// (the smallest of [`ROW_BUCKETS`] that holds them): `{prefix}_{n}`, made by `make(name, n)`
/// the first time this thread asks.
pub fn bucket_kernel(
    prefix: &str,
    rows: usize,
    make: impl FnOnce(&str, usize) -> Result<Kernel>,
) -> Result<(usize, Rc<Kernel>)> {
    let n = ROW_BUCKETS
        .into_iter()
        .find(|&n| n >= rows)
        .unwrap_or(ROWS_PER_CALL);
    let name = format!("{prefix}_{n}");
    if let Some(made) = MADE.with(|m| m.borrow().get(&name).cloned()) {
        return Ok((n, made));
    }
    let made = Rc::new(make(&name, n)?);
    MADE.with(|m| m.borrow_mut().insert(name, made.clone()));
    Ok((n, made))
}

/// `source` without its comment lines: MLX copies a custom kernel's whole source into every
/// call's graph node.
pub fn without_comment_lines(source: &str) -> String {
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_lines_go_and_code_stays() {
        let s = "// a\nint x = 1;  // kept: not a comment line\n  // b\ny();";
        assert_eq!(
            without_comment_lines(s),
            "int x = 1;  // kept: not a comment line\ny();"
        );
    }
}
