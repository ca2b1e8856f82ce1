#![allow(dead_code)]

pub mod postgres;
pub mod server;

pub use server::*;
