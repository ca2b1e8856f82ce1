#![allow(dead_code)]

pub mod postgres;
pub mod proxy;
pub mod server;

pub use server::*;
