-- token(user): an HS256 JWT for the buyer (see `TOKEN_LUA` in ../wrk.rs). The key is put
-- in place of the placeholder below, as a Lua string literal.
local ffi = require("ffi")
local bit = require("bit")
ffi.cdef[[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
unsigned char *HMAC(const EVP_MD *evp_md, const void *key, int key_len,
                    const unsigned char *d, size_t n, unsigned char *md, unsigned int *md_len);
]]
local crypto = ffi.C
if not pcall(function() return crypto.EVP_sha256 end) then
  crypto = ffi.load("crypto")
end
local secret = __SECRET__
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
local function b64url(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = bit.bor(bit.lshift(a, 16), bit.lshift(b or 0, 8), c or 0)
    out[#out + 1] = alphabet:sub(bit.rshift(n, 18) + 1, bit.rshift(n, 18) + 1)
    out[#out + 1] = alphabet:sub(bit.band(bit.rshift(n, 12), 63) + 1, bit.band(bit.rshift(n, 12), 63) + 1)
    if b then
      out[#out + 1] = alphabet:sub(bit.band(bit.rshift(n, 6), 63) + 1, bit.band(bit.rshift(n, 6), 63) + 1)
    end
    if c then
      out[#out + 1] = alphabet:sub(bit.band(n, 63) + 1, bit.band(n, 63) + 1)
    end
  end
  return table.concat(out)
end
local head = b64url('{"alg":"HS256","typ":"JWT"}')
local exp = string.format("%.0f", os.time() + 86400)
local md = ffi.new("unsigned char[32]")
local md_len = ffi.new("unsigned int[1]")
function token(user)
  local signed = head .. "." .. b64url('{"sub":"' .. user .. '","exp":' .. exp .. '}')
  crypto.HMAC(crypto.EVP_sha256(), secret, #secret, signed, #signed, md, md_len)
  return signed .. "." .. b64url(ffi.string(md, 32))
end
