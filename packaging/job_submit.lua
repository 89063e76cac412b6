--[[
kace's submission gate, for Slurm's job_submit/lua plugin (slurm.conf: JobSubmitPlugins=lua;
Slurm 22.05 to 26.05 read job_submit.lua from the directory slurm.conf is in).

A job that asks for colocation (sbatch --kace-colocate[=WORKLOAD]: the kace SPANK plugin puts
KACE_COLOCATE=<workload, or empty for "the job name"> into its SPANK job environment) is
  * held (priority 0) until kace releases it beside a partner, and
  * marked admin_comment = "kace:<workload>", a field only root can change, so kace can trust it.
The workload is validated again here: the plugin runs on the submit host, which users control.
A bad workload refuses the submission with a message saying what is allowed. The rule mirrors
kace_layout::workload_name (Rust), which the plugin, the database and the node programs use;
tests/tests/gate.rs checks that both agree on a list of hostile names. So does what kace cannot
pair (see kace_shape_refusal): a job array, a heterogeneous job, a job that asks for no shard,
and a job submitted with --hold (kace holds it itself; an own hold would be released).

A user's own sbatch (its own plugstack, or libslurm called directly) can put any entry into the
SPANK job environment, and slurmd passes one that already starts with SPANK_ to the prolog
unchanged. So any entry other than KACE_COLOCATE whose name contains KACE (SPANK_KACE_COLOCATE,
KACE_COLOCATE twice, ...) refuses the submission: only the kace plugin's own entry is accepted.
Every other job passes untouched.

Priority 0 set here is a *user* hold (JobHeldUser), which users may normally release;
slurm_job_modify below refuses that release for a kace job from anyone but the uids in
RELEASERS: root, which runs the prolog and the dispatch timer. EpilogSlurmctld runs
kace-dispatch as SlurmUser: a site whose SlurmUser is not root adds that uid here.
]]

-- ---- kace's version and what users are told (kace doctor reads both lines) ------------------
-- kace-gate-version: 0.1.0
-- Keep MAX_HOLD_S equal to dispatch.max_hold_s in kace.conf: it is what users are promised.
local MAX_HOLD_S = 600

-- The one line a user sees at submit: Slurm shows their kace job as (JobHeldUser) and refuses
-- their own `scontrol release`, so say why and for how long.
local function tell_user_held(workload)
  slurm.log_user("kace: job held as workload %s until kace chooses a GPU to share with a partner, " ..
    "at most %d s (then it runs wherever Slurm places it); to opt out, scancel it and submit " ..
    "without --kace-colocate", workload, MAX_HOLD_S)
end
-- ---- end of kace's version and user line ----------------------------------------------------

-- The file kace's decider watches (dispatch.submitted in kace.conf): rewriting it wakes the
-- decider for a new kace job without any Slurm RPC. A failure (no decider, no permission for
-- SlurmUser: packaging/kace.tmpfiles) only leaves the job to the decider's backstop pass.
local SUBMITTED = "/run/kace/submitted"

local function mark_submitted()
  local f = io.open(SUBMITTED, "w")
  if f ~= nil then
    f:close()
  end
end

-- Uids allowed to release a held kace job (root; add SlurmUser's uid if it is not root).
local RELEASERS = { [0] = true }

local MAX_LEN = 128
local RULE = "a workload name is 1 to 128 of A-Z a-z 0-9 . _ + -, not starting with . or -"
local PREFIX = "kace:"

-- The KACE_COLOCATE value of the job's SPANK environment (nil when the job did not ask), and
-- the name of an entry that imitates kace's (nil when there is none).
-- In 22.05 spank_job_env is a 0-based table (or nil), so iterate with pairs, not ipairs.
local function kace_request(job_desc)
  local env = job_desc.spank_job_env
  if env == nil then
    return nil, nil
  end
  local req, seen = nil, 0
  for _, v in pairs(env) do
    if type(v) == "string" then
      local name = string.match(v, "^[^=]*")
      if name == "KACE_COLOCATE" then
        seen = seen + 1
        req = string.sub(v, 15)
      elseif string.find(string.upper(name), "KACE", 1, true)
          and string.sub(name, 1, 20) ~= "_SLURM_SPANK_OPTION_" then
        -- (_SLURM_SPANK_OPTION_<plugin>_<option> is how sbatch records a SPANK option's value;
        -- kace decides nothing from it.)
        return nil, name
      end
    end
  end
  if seen > 1 then
    return nil, "KACE_COLOCATE (more than once)"
  end
  return req, nil
end

local function valid_workload(w)
  return w ~= nil and #w >= 1 and #w <= MAX_LEN and not string.find(w, "[^A-Za-z0-9%._%+%-]")
    and not string.find(w, "^[%.%-]")
end

-- An untrusted value made printable and short for a message.
local function quote(s)
  local shown = string.gsub(string.sub(s, 1, 40), "[%c\128-\255\"\\]", function(c)
    return string.format("\\x%02x", string.byte(c))
  end)
  if #s > 40 then
    return string.format("\"%s\"... (%d bytes)", shown, #s)
  end
  return "\"" .. shown .. "\""
end

-- kace places a held job on a node its partitions, -w and constraint allow, read from squeue;
-- Slurm 22.05's squeue cannot show a job's excluded nodes, so kace could not honour --exclude:
-- refused at submission and as an update of a kace job, with what to do instead.
local function kace_exclude_refusal(job_desc)
  local exc = job_desc.exc_nodes
  if exc ~= nil and exc ~= "" then
    return "kace: couldn't accept --exclude (" .. quote(exc) .. ") with --kace-colocate: "
      .. "kace cannot see excluded nodes; use --partition, --nodelist or --constraint"
  end
  return nil
end

-- Why kace cannot take this --kace-colocate job as it was submitted, as one line for the user,
-- or nil. kace pairs single jobs that ask for shards of one GPU, and holds them itself: an
-- array would be held as one record, a het job's parts could not be placed together, a job
-- without a shard can never share a GPU, and a user's own --hold is the same priority-0 hold as
-- the gate's, which kace releases.
local function kace_shape_refusal(job_desc)
  local array = job_desc.array_inx
  if array ~= nil and array ~= "" then
    return "kace: couldn't accept --kace-colocate on a job array (--array " .. quote(array)
      .. "): submit the jobs one by one"
  end
  local het = job_desc.het_job_offset
  if het ~= nil and het ~= slurm.NO_VAL then
    return "kace: couldn't accept --kace-colocate on a heterogeneous job: submit its parts as separate jobs"
  end
  local tres = job_desc.tres_per_node or ""
  -- gres:shard:N up to 23.02, gres/shard:N from 23.11.
  if not string.find(tres, "gres[:/]shard") then
    return "kace: couldn't accept --kace-colocate without a shard: ask for one with --gres=shard:1"
  end
  -- shard:0 asks for no GPU at all (gres:shard:0, gres/shard:g1:0; a bare gres/shard is one).
  local entry = string.match(tres, "gres[:/]shard[^,]*") or ""
  local count = string.match(entry, ":(%d+)$")
  if count ~= nil and tonumber(count) < 1 then
    return "kace: couldn't accept --kace-colocate with --gres=shard:0: ask for at least one shard"
  end
  if job_desc.priority == 0 then
    return "kace: couldn't accept --hold with --kace-colocate: kace holds the job until it pairs it; submit without --hold"
  end
  return kace_exclude_refusal(job_desc)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local req, imitation = kace_request(job_desc)
  if imitation ~= nil then
    slurm.log_user("kace: couldn't accept SPANK environment entry %s: only the kace plugin sets KACE_COLOCATE",
      quote(imitation))
    slurm.log_info("kace: gate: refused a job of uid %u with SPANK environment entry %s", submit_uid,
      quote(imitation))
    return slurm.ESLURM_ACCESS_DENIED
  end
  if req == nil then
    -- A user must not pass a job off as one kace marked.
    local ac = job_desc.admin_comment
    if submit_uid ~= 0 and ac ~= nil and string.sub(ac, 1, #PREFIX) == PREFIX then
      slurm.log_user("kace: couldn't accept admin_comment %s: only kace sets it", quote(ac))
      return slurm.ESLURM_ACCESS_DENIED
    end
    return slurm.SUCCESS
  end

  local workload, source = req, "--kace-colocate value"
  if workload == "" then
    workload, source = job_desc.name or "", "job name"
  end
  if not valid_workload(workload) then
    slurm.log_user("kace: couldn't accept workload %s (the %s): %s; name it with --kace-colocate=WORKLOAD",
      quote(workload), source, RULE)
    return slurm.ERROR
  end

  local refusal = kace_shape_refusal(job_desc)
  if refusal ~= nil then
    slurm.log_user("%s", refusal)
    return slurm.ERROR
  end

  job_desc.admin_comment = PREFIX .. workload
  job_desc.priority = 0
  slurm.log_verbose("kace: gate: holding a job of uid %u as workload %s", submit_uid, workload)
  tell_user_held(workload)
  mark_submitted()
  return slurm.SUCCESS
end

-- A user's own hold on a kace job (scontrol hold/uhold: priority 0) could not be told apart
-- from the gate's, so kace would release it: refused, with what to do instead. Root (an admin
-- hold, JobHeldAdmin) is not refused, and kace never releases that.
local function kace_hold_refusal(job_desc, job_rec, modify_uid)
  local ac = job_rec.admin_comment
  if RELEASERS[modify_uid] or ac == nil or string.sub(ac, 1, #PREFIX) ~= PREFIX then
    return nil
  end
  if job_desc.priority == 0 then
    return string.format("kace: couldn't hold kace job %u: kace holds it until it pairs it; scancel it to stop it",
      job_rec.job_id)
  end
  return nil
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local hold = kace_hold_refusal(job_desc, job_rec, modify_uid)
  if hold ~= nil then
    slurm.log_user("%s", hold)
    slurm.log_info("kace: gate: refused uid %u holding kace job %u", modify_uid, job_rec.job_id)
    return slurm.ESLURM_ACCESS_DENIED
  end
  local ac = job_rec.admin_comment
  if not RELEASERS[modify_uid] and ac ~= nil and string.sub(ac, 1, #PREFIX) == PREFIX then
    -- A kace job is placed by its shard request: an update that drops it would leave nothing
    -- kace can pair (the decider would hand it back); refused with what to do instead.
    local tres = job_desc.tres_per_node
    if tres ~= nil and tres ~= "" and not string.find(tres, "gres[:/]shard") then
      slurm.log_user("kace: couldn't change kace job %u's GRES to %s: it must ask for a shard; scancel it and submit it without --kace-colocate",
        job_rec.job_id, quote(tres))
      slurm.log_info("kace: gate: refused uid %u dropping the shard of kace job %u", modify_uid,
        job_rec.job_id)
      return slurm.ESLURM_ACCESS_DENIED
    end
    local exclude = kace_exclude_refusal(job_desc)
    if exclude ~= nil then
      slurm.log_user("%s", exclude)
      slurm.log_info("kace: gate: refused uid %u excluding nodes from kace job %u", modify_uid,
        job_rec.job_id)
      return slurm.ESLURM_ACCESS_DENIED
    end
  end
  -- `scontrol release` arrives as priority = INFINITE; other updates carry NO_VAL.
  if not RELEASERS[modify_uid] and ac ~= nil and string.sub(ac, 1, #PREFIX) == PREFIX
      and job_desc.priority == slurm.INFINITE then
    slurm.log_info("kace: gate: refused uid %u releasing kace job %u", modify_uid, job_rec.job_id)
    return slurm.ESLURM_ACCESS_DENIED
  end
  return slurm.SUCCESS
end
