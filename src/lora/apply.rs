//! Which adapters each row of a forward call runs with, and adding their deltas to a linear
//! layer's output.
//!
//! Rows of one batch may run with different adapters (a chunk-stage row next to base-stage
//! rows in one decode step). Each row's delta is computed on that row alone, exactly as the
//! B = 1 path computes it, so a row's numbers do not depend on its neighbours; rows without
//! adapters keep the base output untouched (not even `+ 0`).
use std::fmt;
use std::rc::Rc;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::registry::{AdapterId, AdapterRegistry, LoraPair};
use crate::error::{Error, Result};

/// The adapters one row runs with, added in this order; empty = the base model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterStack(Vec<AdapterId>);

impl AdapterStack {
    /// No adapter.
    pub fn none() -> AdapterStack {
        AdapterStack(Vec::new())
    }

    /// Adapters applied in the given order.
    pub fn new(ids: Vec<AdapterId>) -> AdapterStack {
        AdapterStack(ids)
    }

    /// One adapter.
    pub fn single(id: AdapterId) -> AdapterStack {
        AdapterStack(vec![id])
    }

    /// The adapters, in application order.
    pub fn ids(&self) -> &[AdapterId] {
        &self.0
    }

    /// Whether this is the base model.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The adapters of every row of one forward call, against one registry.
///
/// Made only when at least one row uses an adapter: a call without adapters carries none, so
/// the base path runs no extra operation at all.
#[derive(Clone)]
pub struct Activation {
    registry: Rc<AdapterRegistry>,
    rows: Rc<[AdapterStack]>,
}

impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<Vec<&str>> = self
            .rows
            .iter()
            .map(|s| {
                s.ids()
                    .iter()
                    .map(|&id| self.registry.info(id).map_or("?", |a| a.name.as_str()))
                    .collect()
            })
            .collect();
        f.debug_struct("Activation").field("rows", &names).finish()
    }
}

impl Activation {
    /// Row `r` of the batch runs with `rows[r]`. `None` when no row uses an adapter.
    /// Fails on an id that is not in `registry`.
    pub fn per_row(
        registry: Rc<AdapterRegistry>,
        rows: Vec<AdapterStack>,
    ) -> Result<Option<Activation>> {
        for id in rows.iter().flat_map(|s| s.ids()) {
            if registry.info(*id).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "adapter id {} is not mounted ({} adapters)",
                    id.index(),
                    registry.adapters().len()
                )));
            }
        }
        if rows.iter().all(AdapterStack::is_empty) {
            return Ok(None);
        }
        Ok(Some(Activation {
            registry,
            rows: rows.into(),
        }))
    }

    /// Every one of `batch` rows runs with `stack`.
    pub fn uniform(
        registry: Rc<AdapterRegistry>,
        stack: AdapterStack,
        batch: usize,
    ) -> Result<Option<Activation>> {
        Activation::per_row(registry, vec![stack; batch])
    }

    /// The stacks, one per row.
    pub fn rows(&self) -> &[AdapterStack] {
        &self.rows
    }

    /// The registry the ids refer to.
    pub fn registry(&self) -> &Rc<AdapterRegistry> {
        &self.registry
    }

    /// `y` (the base output of module `path` for input `x`, both batch-major) plus, per row,
    /// the deltas of that row's adapters on this module, in stack order.
    pub fn apply(&self, path: &str, x: &Array, y: Array) -> Result<Array> {
        let Some(pairs) = self.registry.pairs(path) else {
            return Ok(y);
        };
        let b = x.dim(0);
        if b < 1 || b as usize != self.rows.len() || y.dim(0) != b {
            return Err(Error::InvalidArgument(format!(
                "{path}: {} rows of adapters for an input of shape {:?} / output {:?}",
                self.rows.len(),
                x.shape(),
                y.shape()
            )));
        }
        let touches = |s: &AdapterStack| s.ids().iter().any(|id| find(pairs, *id).is_some());
        if !self.rows.iter().any(touches) {
            return Ok(y);
        }
        if b == 1 {
            return add_stack(pairs, &self.rows[0], x, y);
        }
        let mut out = Vec::with_capacity(self.rows.len());
        for (r, stack) in self.rows.iter().enumerate() {
            let r = r as i32;
            let yr = y.try_index(r..r + 1)?;
            out.push(if touches(stack) {
                add_stack(pairs, stack, &x.try_index(r..r + 1)?, yr)?
            } else {
                yr
            });
        }
        Ok(concatenate(&out, 0)?)
    }
}

fn find(pairs: &[(AdapterId, LoraPair)], id: AdapterId) -> Option<&LoraPair> {
    pairs.iter().find(|(i, _)| *i == id).map(|(_, p)| p)
}

fn add_stack(
    pairs: &[(AdapterId, LoraPair)],
    stack: &AdapterStack,
    x: &Array,
    mut y: Array,
) -> Result<Array> {
    for id in stack.ids() {
        if let Some(pair) = find(pairs, *id) {
            y = y.add(pair.delta(x)?)?;
        }
    }
    Ok(y)
}
