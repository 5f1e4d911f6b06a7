-- The Argo CD resource actions of a SpeculatorDeployment. Each sets a one-shot request annotation that the operator
-- acts on once per value (docs/operations/gitops.md); the operator never writes it.
local actions = {}
local paused = false
if obj.status ~= nil and obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.status == "False" and (c.reason == "VerifierChanged" or c.reason == "DraftChanged") then
      paused = true
    end
  end
end
local template = obj.spec ~= nil and obj.spec.upgradePolicy ~= nil and obj.spec.upgradePolicy.trainTemplate ~= nil
actions["resolve-now"] = { ["disabled"] = false }
actions["retrain-now"] = { ["disabled"] = not template }
actions["resume-upgrade"] = { ["disabled"] = not paused }
return actions
