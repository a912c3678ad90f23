//! The CLI's handling of the environment the TypeScript drop-in shares
//! (`$MLX_BUN_MEMORY_BATCH`): a value that is not a positive integer still answers, at the
//! default width, and says so on stderr instead of falling back silently.
mod model_support;

use std::process::Command;

use model_support::model_dir;

/// Runs `memexec run` on one short call with `$MLX_BUN_MEMORY_BATCH` set to `batch`.
fn run_with_batch_env(batch: &str) -> (String, String) {
    let input = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(
        input.path(),
        "{\"stage\":\"route\",\"user\":\"Is this a question?\",\"max_tokens\":2}\n",
    )
    .expect("write input");
    let out = Command::new(env!("CARGO_BIN_EXE_memexec"))
        .args(["run", "--model"])
        .arg(model_dir("tiny-gemma4-q4-f32"))
        .arg("--input")
        .arg(input.path())
        .env("MLX_BUN_MEMORY_BATCH", batch)
        .env_remove("RUST_LOG")
        .output()
        .expect("run memexec");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "memexec run failed: {stderr}");
    (stdout, stderr)
}

#[test]
fn a_bad_batch_width_is_reported_and_the_default_used() {
    let (stdout, stderr) = run_with_batch_env("eight");
    assert!(stdout.contains("\"line\":1"), "no answer: {stdout}");
    assert!(
        stderr.contains("MLX_BUN_MEMORY_BATCH=\"eight\" is not a positive integer: batch width 8"),
        "no warning: {stderr}"
    );
    assert!(stderr.contains("mode batched, batch width 8"), "{stderr}");
}

#[test]
fn a_good_batch_width_is_used_without_a_warning() {
    // 1 (serial) also skips the batched start-up check: the cheaper run.
    let (stdout, stderr) = run_with_batch_env("1");
    assert!(stdout.contains("\"line\":1"), "no answer: {stdout}");
    assert!(!stderr.contains("not a positive integer"), "{stderr}");
    assert!(stderr.contains("batch width 1"), "{stderr}");
}
