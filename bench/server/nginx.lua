-- SPDX-License-Identifier: Apache-2.0
-- wrk script: GET a small static file with X-User-Id spread uniformly over 100,000 ids, the key of
-- nginx's limit_req zone.
local keys = 100000
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
end

function init(args)
  math.randomseed(os.time() + (seed or 0) * 7919)
end

function request()
  return wrk.format("GET", "/index.html", { ["X-User-Id"] = tostring(math.random(0, keys - 1)) })
end
