#![allow(dead_code)]

pub mod certs;
pub mod cluster;
pub mod mariadb;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod sentinel;
pub mod server;

pub use server::*;
