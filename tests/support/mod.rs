#![allow(dead_code)]

pub mod server;

pub use server::*;
