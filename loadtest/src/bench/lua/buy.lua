-- The buy script's requests: a new buyer each (see `buy_script` in ../wrk.rs).
local counter = 0
local threads = 0
local base = 0
local paths = {}
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  base = tonumber(args[1]) * 100000000000
  if #args > 1 then
    local shared_by = tonumber(args[2])
    for i = 3, #args do
      if (i - 3) % shared_by == id then
        paths[#paths + 1] = args[i]
      end
    end
  end
end
request = function()
  counter = counter + 1
  local user = string.format("%.0f", base + id * 1000000000 + counter)
  local path = nil
  if #paths > 0 then
    path = paths[counter % #paths + 1]
  end
  return wrk.format("POST", path,
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token(user)},
    '{"user_id": ' .. user .. '}')
end
