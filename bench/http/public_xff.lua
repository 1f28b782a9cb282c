-- SPDX-License-Identifier: Apache-2.0
-- wrk script: GET /public as if from many clients behind one trusted proxy (127.0.0.1), so the
-- per-IP limit admits (nearly) everything and the benchmark measures the admitted path:
-- 20,000 client addresses, each seen a few times a second at most (its limit: r=5/s, b=60).
local counter = 0
request = function()
  counter = counter + 1
  local n = counter % 20000
  local ip = "10." .. math.floor(n / 250) % 250 .. "." .. n % 250 .. ".7"
  return wrk.format("GET", "/public", { ["X-Forwarded-For"] = ip })
end
