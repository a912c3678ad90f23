//! memexec's own NVRTC call (`nvrtc_ffi::compile_for`), the one that compiles the precompiled
//! kernel modules on a device, run here on the CPU against NVIDIA's NVRTC 12.9 from PyPI.
//!
//! Ignored in a plain `cargo test`: it needs NVRTC on the library path and the modules the
//! library's self-checks dump. `scripts/test.d/80-gpu-scripts.sh` runs it for real in CI:
//! it fetches NVRTC (`scripts/gpu/nvrtc_check.py`), dumps the modules, and sets
//! `LD_LIBRARY_PATH`, `MEMEXEC_NVRTC_MODULES` (the dump folder) and `MEMEXEC_NVRTC_INCLUDES`
//! (the CCCL and CUDA runtime include folders, `:`-separated).
use std::path::PathBuf;

use memexec::model::precompiled::PRELUDE;
use memexec::nvrtc_ffi::compile_for;

fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (see this file's header)"))
}

fn includes() -> Vec<PathBuf> {
    setting("MEMEXEC_NVRTC_INCLUDES")
        .split(':')
        .map(PathBuf::from)
        .collect()
}

#[test]
#[ignore = "needs NVRTC and dumped modules: scripts/test.d/80-gpu-scripts.sh runs it"]
fn every_dumped_module_compiles_to_a_cubin() {
    let dir = PathBuf::from(setting("MEMEXEC_NVRTC_MODULES"));
    let mut modules: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the dump folder")
        .map(|e| e.expect("a dump entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    modules.sort();
    assert!(
        modules.len() >= 5,
        "too few dumped modules in {}",
        dir.display()
    );
    for m in &modules {
        let name = m.file_stem().unwrap().to_string_lossy();
        let source = std::fs::read_to_string(m).unwrap();
        let image = compile_for(&name, &format!("{PRELUDE}\n{source}"), (9, 0), &includes())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // A cubin is an ELF image.
        assert_eq!(&image[..4], b"\x7fELF", "{name}");
    }
}

#[test]
#[ignore = "needs NVRTC: scripts/test.d/80-gpu-scripts.sh runs it"]
fn a_module_that_does_not_compile_reports_nvrtcs_log() {
    let e = compile_for(
        "memexec_planted_error",
        &format!("{PRELUDE}\nextern \"C\" __global__ void k(float* o) {{ o[0] = undeclared; }}"),
        (9, 0),
        &includes(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("undeclared"), "{e}");
}
