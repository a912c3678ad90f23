//! How the cost of one batched decode step grows with the number of rows (B = 1..16) on this
//! backend: `cargo run --release --example decode_scaling -- MODEL_DIR`. Prints ms per step and
//! ms per row-token; batching pays where the per-row cost falls as B grows.
use std::time::Instant;

use memexec::generate::{decode_step, prefill, PREFILL_STEP};
use memexec::model::{ForwardCtx, Model};

fn main() -> memexec::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| ".deps/fixtures/tiny-gemma4-q4-f32".into());
    let model = Model::load(std::path::Path::new(&dir))?;
    let ctx = ForwardCtx::default();
    println!("{dir}\n   B   ms/step   ms/row-token");
    for b in [1usize, 2, 4, 8, 16] {
        let mut caches: Vec<_> = (0..b).map(|_| model.new_cache()).collect();
        let mut last = Vec::new();
        for (i, c) in caches.iter_mut().enumerate() {
            let prompt: Vec<u32> = (0..(20 + 7 * i as u32))
                .map(|t| 2 + (t * 37 + i as u32) % 3000)
                .collect();
            last.push(prefill(&model, &prompt, c, PREFILL_STEP, &ctx)?);
        }
        let steps = 12;
        let mut times = Vec::new();
        for _ in 0..steps {
            let mut refs: Vec<&mut _> = caches.iter_mut().collect();
            let t = Instant::now();
            last = decode_step(&model, &last, &mut refs, &ctx)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let med = times[steps / 2];
        println!("{b:>4} {med:>9.2} {:>14.3}", med / b as f64);
    }
    Ok(())
}
