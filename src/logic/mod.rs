//! Pure logic, the floor of the stack: no I/O, no clock of its own, tested
//! exhaustively without Redis. Nothing here names a module above it.

pub(crate) mod fence;
pub mod limits;
pub(crate) mod quorum;
pub(crate) mod resource;
pub(crate) mod validity;
