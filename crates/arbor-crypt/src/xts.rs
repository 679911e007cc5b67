//! AES-256-XTS of one data unit at a time, through aws-lc's EVP interface
//! (`EVP_aes_256_xts`): the crate's only unsafe code.
//!
//! A [`Ctx`] holds one key schedule, for encryption or for decryption; a
//! data unit is done by setting the unit's tweak as the IV (the key
//! schedule kept) and one update over the whole unit, in place. A context
//! is used by one thread at a time (`&mut self`); `VolumeCipher` keeps a
//! few to share.

use std::os::raw::c_int;
use std::ptr::{self, NonNull};

use aws_lc_sys::{
    EVP_CIPHER_CTX_free, EVP_CIPHER_CTX_new, EVP_DecryptInit_ex, EVP_DecryptUpdate,
    EVP_EncryptInit_ex, EVP_EncryptUpdate, EVP_aes_256_xts, ENGINE, EVP_CIPHER, EVP_CIPHER_CTX,
};

use crate::CryptError;

/// Bytes of an AES-256-XTS key: two AES-256 keys.
pub(crate) const XTS_KEY_LEN: usize = 64;

/// The largest data unit a context takes in one update (a u32 length, and
/// far above the 4 KiB units arbor uses).
const MAX_UNIT: usize = 1 << 20;

type Init = unsafe extern "C" fn(
    *mut EVP_CIPHER_CTX,
    *const EVP_CIPHER,
    *mut ENGINE,
    *const u8,
    *const u8,
) -> c_int;
type Update =
    unsafe extern "C" fn(*mut EVP_CIPHER_CTX, *mut u8, *mut c_int, *const u8, c_int) -> c_int;

pub(crate) struct Ctx {
    ctx: NonNull<EVP_CIPHER_CTX>,
    init: Init,
    update: Update,
}

// SAFETY: an EVP_CIPHER_CTX is plain memory owned by this value alone (no
// thread-local state, no shared references); it may move between threads,
// and `&mut self` keeps it to one at a time.
unsafe impl Send for Ctx {}

impl Ctx {
    /// A context for `key` (the two AES-256 keys, key 1 first), to encrypt
    /// or to decrypt. aws-lc refuses a key whose halves are equal.
    pub(crate) fn new(key: &[u8; XTS_KEY_LEN], encrypt: bool) -> Result<Self, CryptError> {
        // SAFETY: EVP_CIPHER_CTX_new has no preconditions; null is checked.
        let raw = unsafe { EVP_CIPHER_CTX_new() };
        let ctx = NonNull::new(raw).ok_or(CryptError::Cipher("no memory for a cipher context"))?;
        let (init, update): (Init, Update) = if encrypt {
            (EVP_EncryptInit_ex, EVP_EncryptUpdate)
        } else {
            (EVP_DecryptInit_ex, EVP_DecryptUpdate)
        };
        let this = Self { ctx, init, update };
        // SAFETY: `ctx` is a fresh, valid context; the cipher pointer is a
        // static of aws-lc; `key` is 64 readable bytes, the length
        // EVP_aes_256_xts expects; a null IV is allowed here (set per unit).
        let ok = unsafe {
            (this.init)(
                this.ctx.as_ptr(),
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
            )
        };
        if ok != 1 {
            return Err(CryptError::Cipher("AES-256-XTS refused the key"));
        }
        Ok(this)
    }

    /// Encrypts (or decrypts, as made) `unit` in place with tweak `tweak`.
    /// `unit` is 16 bytes to 1 MiB long.
    pub(crate) fn unit(&mut self, tweak: &[u8; 16], unit: &mut [u8]) -> Result<(), CryptError> {
        if !(16..=MAX_UNIT).contains(&unit.len()) {
            return Err(CryptError::Cipher("a data unit of 16 bytes to 1 MiB"));
        }
        // At most 1 MiB (checked above): fits a c_int.
        let len = unit.len() as c_int;
        let mut out_len: c_int = 0;
        let ctx = self.ctx.as_ptr();
        let data = unit.as_mut_ptr();
        // SAFETY: `ctx` was set up with a key by `new`, in the direction of
        // `init` and `update`, and is ours alone (&mut self); the tweak is
        // 16 readable bytes (XTS's IV length); null cipher, engine and key
        // keep the key schedule. The update reads and writes `len` bytes at
        // `data`, all inside `unit`, which we borrow mutably; XTS in aws-lc
        // works in place (in == out).
        let ok = unsafe {
            (self.init)(
                ctx,
                ptr::null(),
                ptr::null_mut(),
                ptr::null(),
                tweak.as_ptr(),
            ) == 1
                && (self.update)(ctx, data, &mut out_len, data, len) == 1
        };
        if !ok || out_len != len {
            return Err(CryptError::Cipher("AES-256-XTS failed on a data unit"));
        }
        Ok(())
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from EVP_CIPHER_CTX_new and is freed once, here.
        // aws-lc's free cleans up the key schedule and clears the memory it
        // returns (OPENSSL_free zeroes what it frees).
        unsafe { EVP_CIPHER_CTX_free(self.ctx.as_ptr()) }
    }
}
