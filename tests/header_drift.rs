//! The committed C header must equal what cbindgen generates from `src/capi` for this build
//! (wasmtime-style drift check). Regenerate with `MEMEXEC_UPDATE_HEADER=1 cargo build`.

#[test]
fn committed_header_matches_generated() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/memexec.h");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != memexec::GENERATED_HEADER {
        let first_diff = committed
            .lines()
            .zip(memexec::GENERATED_HEADER.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || "at the end".to_string(),
                |n| format!("at line {}", n + 1),
            );
        panic!(
            "include/memexec.h is out of date with src/capi (first difference {first_diff}); \
             run `MEMEXEC_UPDATE_HEADER=1 cargo build` and commit the header"
        );
    }
}
