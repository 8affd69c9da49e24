-- In the PDF, an unlabelled callout (the Answer that opens each chapter) is set inside a block
-- whose spacing Typst drops at its end, so the paragraph after it touched its border: a space
-- follows each one. A labelled callout is a cross-reference figure, spaced as one.
local unlabelled = {}

local function note_unlabelled(el)
  if el.attr.identifier == "" then
    unlabelled[el.__quarto_custom_node.attributes["__quarto_custom_id"]] = true
  end
end

local function space_after(blocks)
  local spaced = pandoc.Blocks({})
  for _, block in ipairs(blocks) do
    spaced:insert(block)
    if block.t == "Div" and unlabelled[block.attributes["__quarto_custom_id"] or ""] then
      spaced:insert(pandoc.RawBlock("typst", "#v(0.8em)"))
    end
  end
  return spaced
end

if not quarto.doc.is_format("typst") then
  return {}
end
return { { Callout = note_unlabelled }, { Blocks = space_after } }
