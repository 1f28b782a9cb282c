-- SPDX-License-Identifier: Apache-2.0
-- wrk script: POST /v1/check for ids spread uniformly over 100,000 keys. The rule comes from the
-- RULE environment variable (default "bench").
local keys = 100000
local rule = os.getenv("RULE") or "bench"
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
end

function init(args)
  math.randomseed(os.time() + (seed or 0) * 7919)
end

function request()
  local body = '{"rule":"' .. rule .. '","key":"user:' .. math.random(0, keys - 1) .. '"}'
  return wrk.format("POST", "/v1/check", { ["Content-Type"] = "application/json" }, body)
end
