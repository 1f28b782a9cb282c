-- SPDX-License-Identifier: Apache-2.0
-- wrk script for bench/leases/run.sh: POST /v1/check, 90% on 1,000 hot keys (rule RULE_hot), 10% on
-- 100,000 cold keys (rule RULE_cold). Run with as many threads as connections (-tN -cN): each thread
-- then has one request in flight, so a response belongs to the thread's last request. Admissions
-- are counted per hot key and per fixed window (WINDOW seconds; its end is reset_after_ms from
-- now), and written to OUT as "key window admitted" lines.
local rule = os.getenv("RULE") or "lease"
local window = tonumber(os.getenv("WINDOW") or "10")
local counter = 0
local threads = {}

function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
  table.insert(threads, thread)
end

local last_key = nil
admitted = {}

function init(args)
  math.randomseed(os.time() + (seed or 0) * 7919)
end

function request()
  local body
  if math.random() < 0.9 then
    last_key = "hot:" .. math.random(0, 999)
    body = '{"rule":"' .. rule .. '_hot","key":"' .. last_key .. '"}'
  else
    last_key = nil
    body = '{"rule":"' .. rule .. '_cold","key":"cold:' .. math.random(0, 99999) .. '"}'
  end
  return wrk.format("POST", "/v1/check", { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  if status ~= 200 or last_key == nil then return end
  local reset_ms = tonumber(string.match(body, '"reset_after_ms":(%d+)'))
  if reset_ms == nil then return end
  -- The window's end is a multiple of WINDOW; os.time() is off by under a second.
  local index = math.floor((os.time() + reset_ms / 1000) / window + 0.5) - 1
  local k = last_key .. " " .. index
  admitted[k] = (admitted[k] or 0) + 1
end

function done(summary, latency, requests)
  local out = io.open(os.getenv("OUT"), "w")
  for _, t in ipairs(threads) do
    for k, n in pairs(t:get("admitted")) do out:write(k, " ", n, "\n") end
  end
  out:close()
end
