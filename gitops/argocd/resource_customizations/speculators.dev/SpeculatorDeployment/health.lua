-- Argo CD health of a SpeculatorDeployment, from the conditions the operator writes (docs/operations/gitops.md).
-- Uses only the libraries Argo CD opens for a script set in argocd-cm (base and table): no string or math.
local hs = {}
local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end
local function words(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. obj.metadata.generation
  return hs
end
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = words(stalled)
  return hs
end
local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = words(reconciling)
  return hs
end
local verifier = condition("VerifierCurrent")
local draft = condition("DraftCurrent")
if verifier ~= nil and verifier.status == "False" and verifier.reason == "VerifierChanged" then
  hs.status = "Suspended"
  hs.message = words(verifier)
  return hs
end
if draft ~= nil and draft.status == "False" and draft.reason == "DraftChanged" then
  hs.status = "Suspended"
  hs.message = words(draft)
  return hs
end
if verifier ~= nil and verifier.status == "False" and verifier.reason == "Retraining" then
  hs.status = "Progressing"
  hs.message = words(verifier)
  return hs
end
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" and draft ~= nil and draft.status == "False" and draft.reason == "CanaryRejected" then
  -- the incumbent serves; the rejected draft and both sides' figures are the news
  hs.status = "Healthy"
  hs.message = words(draft)
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = words(ready)
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = words(ready)
else
  hs.message = "Waiting for the operator"
end
return hs
