//! The wire: the only place that knows Redis's byte and reply formats. The
//! lock's commands and their reply parsers, the Lua scripts (as `.lua`
//! files) and how they are sent, and the parsers of server metadata.

pub(crate) mod commands;
pub(crate) mod info;
pub(crate) mod outgoing;
pub(crate) mod pipelined;
pub(crate) mod probe;
pub(crate) mod resp;
pub(crate) mod scripts;
pub(crate) mod transacted;
