//! LoRA adapters (SPEC §6): read mlx-lm / peft adapter directories, validate every pair
//! against the base model, mount all adapters once, and add per-row deltas in linear layers.
//!
//! Flow: [`AdapterRegistry::new`] with the model's linear modules → [`AdapterRegistry::mount`]
//! per adapter directory (read + validate + load; nothing changes on error) → freeze it in an
//! `Rc` → per forward call an [`Activation`] (which adapters each row runs with, or none at
//! all) → each linear layer calls [`Activation::apply`] on its base output.
//!
//! An engine: at start-up `AdapterRegistry::new(model.linear_modules())`, `mount_named(name,
//! dir)` per configured adapter (a failure leaves the others and the base model usable),
//! `Rc::new`; per request map its stage to a stack (`chunk` → `registry.id("memory-chunk")`,
//! other stages → [`AdapterStack::none`]); per forward call `ForwardCtx::with_adapters(
//! Activation::per_row(registry, stacks)?)`, one stack per batch row, for prefill and decode.
//!
//! Output of a module with pairs: `y = base(x) + cast(scale * ((x @ A) @ B), x.dtype)`, one
//! term per adapter of the row's stack, in stack order.
pub mod adapter;
pub mod apply;
pub mod names;
pub mod registry;
pub mod validate;

pub use adapter::{AdapterFiles, LoraScale, RankDivisor};
pub use apply::{Activation, AdapterStack};
pub use registry::{AdapterId, AdapterInfo, AdapterRegistry, LoraPair};
pub use validate::{ModuleShape, ModuleTable};
